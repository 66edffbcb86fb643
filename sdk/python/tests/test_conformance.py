"""The conformance scenarios of sdk/conformance/SCENARIOS.md, on both targets (throughput:
tests/bench_throughput.py, run once by .ci/sdk-python)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import grpc
import pytest

import kairos
from kairos import api

from conftest import Target

HERE = Path(__file__).resolve().parent


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def definition(name: str, *, max_attempts: int = 3, lease: str = "30s", base_delay: str = "100ms") -> str:
    return (
        f"name: {name}\nversion: 1\ninputs:\n  n: {{type: int, required: false}}\n"
        f"retry: {{max_attempts: {max_attempts}, base_delay: {base_delay}, max_delay: 1s}}\n"
        f"timeouts: {{lease: {lease}}}\nexecution:\n  type: python\n"
    )


async def apply(c: kairos.Client, name: str, **kw: Any) -> None:
    r = await c.apply_definition(definition(name, **kw))
    assert r.definition.name == name and r.definition.queue == name


class Running:
    """A worker running in the background of a test."""

    def __init__(self, worker: kairos.Worker) -> None:
        self.worker = worker
        self.task = asyncio.ensure_future(worker.run())

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, 20)

    async def __aenter__(self) -> "Running":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.task.done():
            await self.stop()
        else:
            self.task.result()


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 60))


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.scenario("submit-idempotent")
def test_submit_idempotent(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c:
            name = unique("py-idem")
            await apply(c, name)
            key = unique("k")
            a = await c.submit(name, 1, {"n": 1}, idempotency_key=key)
            b = await c.submit(name, 1, {"n": 1}, idempotency_key=key)
            assert a.created and not b.created
            assert a.execution_id == b.execution_id
            with pytest.raises(kairos.KairosError) as e:
                await c.submit(name, 1, {"n": 2}, idempotency_key=key)
            assert e.value.code == grpc.StatusCode.ALREADY_EXISTS, e.value

    run(body)


@pytest.mark.scenario("get-by-key")
def test_get_by_key(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c:
            name = unique("py-get")
            await apply(c, name)
            key = unique("k")
            s = await c.submit(name, 1, {"n": 7}, idempotency_key=key, after=3600)
            by_id = (await c.get(s.execution_id)).execution
            by_key = (await c.get_by_key(key)).execution
            assert by_id.execution_id == by_key.execution_id == s.execution_id
            assert json.loads(by_id.inputs_json) == {"n": 7} == json.loads(by_key.inputs_json)
            assert by_key.idempotency_key == key
            with pytest.raises(kairos.KairosError) as e:
                await c.get_by_key(unique("absent"))
            assert e.value.code == grpc.StatusCode.NOT_FOUND

    run(body)


@pytest.mark.scenario("delayed")
def test_delayed(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-delayed")
            await apply(c, name)
            starts: list[int] = []
            w = kairos.Worker(wc, name, concurrency=2)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                starts.append(now_ms())
                return {"doubled": task.inputs["n"] * 2}

            async with Running(w):
                s = await c.submit(name, 1, {"n": 21}, after=1.5)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED, done
            assert json.loads(done.output_json) == {"doubled": 42}
            assert len(starts) == 1 and starts[0] >= s.execute_at_ms, (starts, s.execute_at_ms)

    run(body)


@pytest.mark.scenario("retry-backoff")
def test_retry_backoff(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-retry")
            await apply(c, name, max_attempts=3)
            w = kairos.Worker(wc, name)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                if task.attempt < 3:
                    raise kairos.RetryableError(f"attempt {task.attempt} fails")
                return {"attempt": task.attempt}

            async with Running(w):
                s = await c.submit(name, 1)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED, done
            assert done.attempt_count == 3
            attempts = (await c.get(s.execution_id)).attempts
            assert [a.number for a in attempts] == [1, 2, 3]
            assert [a.status for a in attempts] == [api.ATTEMPT_STATUS_FAILED] * 2 + [api.ATTEMPT_STATUS_SUCCEEDED]
            for prev, nxt in zip(attempts, attempts[1:]):
                assert nxt.started_at_ms >= prev.ended_at_ms > 0, (prev, nxt)
            assert attempts[0].error.message == "attempt 1 fails" and attempts[0].error.retryable

    run(body)


@pytest.mark.scenario("non-retryable")
def test_non_retryable(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-permanent")
            await apply(c, name, max_attempts=5)
            w = kairos.Worker(wc, name)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                raise kairos.NonRetryableError("the report date is in the future", code="bad-date")

            async with Running(w):
                s = await c.submit(name, 1)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_FAILED, done
            assert done.attempt_count == 1
            assert done.error.message == "the report date is in the future"
            assert done.error.code == "bad-date" and not done.error.retryable

    run(body)


@pytest.mark.scenario("cancel-running")
def test_cancel_running(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-cancel")
            await apply(c, name, lease="3s")
            started = asyncio.Event()
            observed: list[float] = []
            w = kairos.Worker(wc, name)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                started.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    observed.append(time.monotonic())
                    raise
                return "not cancelled"

            async with Running(w):
                s = await c.submit(name, 1)
                await asyncio.wait_for(started.wait(), 10)
                asked = time.monotonic()
                r = await c.cancel(s.execution_id)
                assert not r.cancelled  # running: its worker is asked to stop
                done = await c.wait(s.execution_id, 15)
            assert observed and observed[0] - asked < 5.0, observed
            assert done.status == api.EXECUTION_STATUS_CANCELLED, done

    run(body)


@pytest.mark.scenario("worker-killed")
def test_worker_killed(target: Target, tmp_path: Path) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-killed")
            await apply(c, name, lease="2s")
            started = tmp_path / "started"
            child = subprocess.Popen(
                [sys.executable, str(HERE / "worker_child.py"), name, str(started)],
                env=target.worker_env(),
            )
            try:
                s = await c.submit(name, 1)
                deadline = time.monotonic() + 20
                while not (started.is_file() and started.read_text()):
                    assert child.poll() is None, "the child worker exited"
                    assert time.monotonic() < deadline, "the child worker never started the attempt"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # its first heartbeat: the attempt counts
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
            assert started.read_text().split() == [s.execution_id, "1"]
            runs: list[int] = []
            w = kairos.Worker(wc, name, worker_id="py-second")

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                runs.append(task.attempt)
                return {"by": "second"}

            async with Running(w):
                done = await c.wait(s.execution_id, 30)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED, done
            assert done.attempt_count == 2 and runs == [2], (done.attempt_count, runs)
            attempts = (await c.get(s.execution_id)).attempts
            assert attempts[-1].worker_id == "py-second"
            assert json.loads(done.output_json) == {"by": "second"}

    run(body)


@pytest.mark.scenario("stale-fenced")
def test_stale_fenced(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-stale")
            await apply(c, name, lease="1s")
            first_started = asyncio.Event()
            release_first = asyncio.Event()
            acks_a: list[kairos.Ack] = []
            a = kairos.Worker(wc, name, concurrency=1, worker_id="py-stale-a", heartbeats=False, on_ack=acks_a.append)

            @a.handler(name)
            async def slow(task: kairos.Task) -> Any:
                first_started.set()
                await release_first.wait()
                return {"by": "a"}

            b = kairos.Worker(wc, name, concurrency=1, worker_id="py-stale-b")

            @b.handler(name)
            async def fast(task: kairos.Task) -> Any:
                return {"by": "b", "attempt": task.attempt}

            async with Running(a) as ra:
                s = await c.submit(name, 1)
                await asyncio.wait_for(first_started.wait(), 10)
                async with Running(b):
                    done = await c.wait(s.execution_id, 20)
                assert done.status == api.EXECUTION_STATUS_SUCCEEDED, done
                assert json.loads(done.output_json)["by"] == "b"
                release_first.set()
                deadline = time.monotonic() + 10
                while not acks_a:
                    assert time.monotonic() < deadline, "attempt 1's result never acknowledged"
                    await asyncio.sleep(0.05)
                await ra.stop()
            assert len(acks_a) == 1 and acks_a[0].fenced and not acks_a[0].applied, acks_a
            assert a.fenced == 1 and a.applied == 0
            after = (await c.get(s.execution_id)).execution
            assert after.status == api.EXECUTION_STATUS_SUCCEEDED
            assert json.loads(after.output_json)["by"] == "b"

    run(body)


@pytest.mark.scenario("list-pages")
def test_list_pages(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c:
            name = unique("py-list")
            await apply(c, name)
            prefix = unique("page")
            subs = [kairos.Submission(name, 1, {"n": i}, after=3600, idempotency_key=f"{prefix}-{i}") for i in range(25)]
            results = await c.submit_many(subs)
            assert all(isinstance(r, api.SubmitResponse) for r in results), results
            submitted = {r.execution_id for r in results if isinstance(r, api.SubmitResponse)}
            pages: list[list[str]] = []
            cursor = b""
            while True:
                page = await c.list(definition=name, limit=10, cursor=cursor)
                pages.append([e.execution_id for e in page.executions])
                assert all(e.idempotency_key.startswith(prefix) for e in page.executions)
                if not page.next_cursor:
                    break
                cursor = page.next_cursor
            ids = [i for p in pages for i in p]
            assert len(ids) == 25 and len(set(ids)) == 25 and set(ids) == submitted
            assert [len(p) for p in pages if p] == [10, 10, 5], [len(p) for p in pages]
            with pytest.raises(kairos.LimitError) as e:
                await c.list(limit=1001)
            assert e.value.field == "limit"

    run(body)


@pytest.mark.scenario("cron")
def test_cron(target: Target) -> None:
    async def body() -> None:
        async with target.client() as c, target.worker_client() as wc:
            name = unique("py-cron")
            await apply(c, name)
            w = kairos.Worker(wc, name)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                return {"ok": True}

            job_id = unique("py-job")
            async with Running(w):
                created = await c.create_cron(name, 1, "* * * * * *", timezone="UTC", cron_job_id=job_id, inputs={"n": 1})
                assert created.created and created.cron_job.status == api.CRON_STATUS_ACTIVE
                await asyncio.sleep(3.5)
                paused = await c.pause_cron(job_id)
                assert paused.status == api.CRON_STATUS_PAUSED
                # The runs made before the pause finish.
                deadline = time.monotonic() + 10
                while True:
                    runs = list((await c.cron_runs(job_id)).executions)
                    if runs and all(r.status in kairos.TERMINAL for r in runs):
                        break
                    assert time.monotonic() < deadline, runs
                    await asyncio.sleep(0.1)
            assert len(runs) >= 2, runs
            assert all(r.status == api.EXECUTION_STATUS_SUCCEEDED for r in runs), runs
            keys = [r.idempotency_key for r in runs]
            assert len(set(keys)) == len(keys)
            assert all(k.startswith(f"cron:{job_id}:") for k in keys), keys
            assert all(r.cron_job_id == job_id for r in runs)
            occ = await c.preview_cron("* * * * * *", timezone="UTC", limit=3)
            assert len(occ) == 3 and occ[1].utc_ms - occ[0].utc_ms == 1000, occ
            resumed = await c.resume_cron(job_id)
            assert resumed.status == api.CRON_STATUS_ACTIVE
            updated = await c.update_cron(job_id, expression="0 0 * * *")
            assert updated.expression == "0 0 * * *"
            await c.delete_cron(job_id)
            with pytest.raises(kairos.KairosError) as e:
                await c.get_cron(job_id)
            assert e.value.code == grpc.StatusCode.NOT_FOUND

    run(body)

"""The SDK's surface beyond the conformance list: keys and TLS, client-side limits, the
thread-pool mode, handler time-outs, graceful shutdown, replay, definitions, batching."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import grpc
import pytest

import kairos
from kairos import api
from kairos._worker import _result_chunks

from conftest import Target
import test_conformance
from test_conformance import Running, apply, run, unique


def test_a_call_without_a_key_is_unauthenticated(serve_target: Target) -> None:
    async def body() -> None:
        async with kairos.Client(serve_target.grpc, api_key="", tls=serve_target.tls) as c:
            with pytest.raises(kairos.KairosError) as e:
                await c.list_definitions()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED

    run(body)


def test_the_key_is_sent_on_every_call_and_scopes_hold(serve_target: Target) -> None:
    async def body() -> None:
        async with serve_target.client() as c:
            me = await c.who_am_i()
            assert me.authentication and sorted(me.scopes) == ["definitions", "read", "submit"]
            # The client's key has no `worker` scope: a worker with it stops with the reason.
            w = kairos.Worker(c, "anything")
            with pytest.raises(kairos.KairosError) as e:
                await asyncio.wait_for(w.run(), 10)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, e.value
            # Nor may it create keys.
            with pytest.raises(kairos.KairosError) as e2:
                await c.create_api_key(["read"])
            assert e2.value.code == grpc.StatusCode.PERMISSION_DENIED
        async with kairos.Client(serve_target.grpc, api_key=serve_target.admin_key, tls=serve_target.tls) as admin:
            key, token = await admin.create_api_key(["read"], name="py-revoked")
            assert token.startswith(f"kai_{key.id}_")
            assert any(k.id == key.id for k in await admin.list_api_keys())
            revoked = await admin.revoke_api_key(key.id)
            assert revoked.revoked_at_ms > 0
        async with kairos.Client(serve_target.grpc, api_key=token, tls=serve_target.tls) as gone:
            with pytest.raises(kairos.KairosError) as e3:
                await gone.who_am_i()
            assert e3.value.code == grpc.StatusCode.UNAUTHENTICATED

    run(body)


def test_mutual_tls_refuses_a_client_without_a_certificate(serve_target: Target) -> None:
    async def body() -> None:
        assert serve_target.tls is not None
        tls = kairos.Tls(ca_cert=serve_target.tls.ca_cert)
        async with kairos.Client(serve_target.grpc, api_key=serve_target.client_key, tls=tls, timeout=5) as c:
            with pytest.raises(kairos.KairosError) as e:
                await c.who_am_i()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.tls_failure, e.value
        # Without our CA the node's certificate is not trusted.
        async with kairos.Client(serve_target.grpc, api_key=serve_target.client_key, tls=kairos.Tls(), timeout=5) as c:
            with pytest.raises(kairos.KairosError) as e:
                await c.who_am_i()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.tls_failure, e.value

    run(body)


def test_tls_settings_are_checked_before_connecting() -> None:
    with pytest.raises(kairos.LimitError) as e:
        kairos.Client("http://127.0.0.1:1", tls=kairos.Tls(ca_cert="ca.pem"))
    assert e.value.field == "tls"
    with pytest.raises(kairos.LimitError) as e:
        kairos.Client("https://127.0.0.1:1", tls=kairos.Tls(client_cert="c.pem"))
    assert e.value.field == "client_cert"
    with pytest.raises(kairos.LimitError) as e:
        kairos.Client("https://127.0.0.1:1", tls=kairos.Tls(ca_cert="/nonexistent/ca.pem"))
    assert e.value.field == "ca_cert" and "/nonexistent/ca.pem" in e.value.message


def test_limits_are_refused_client_side_naming_the_field(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-limits")
            await apply(c, name)
            with pytest.raises(kairos.LimitError) as e:
                await c.submit(name, 1, {"n": 1, "pad": "x" * 33_000})
            assert e.value.field == "inputs" and "32768" in e.value.message
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(kairos.LimitError) as e:
                await c.submit(name, 1, at=123, after=1)
            assert e.value.field == "at"
            # The node's own validation: the code, and the field its message names.
            with pytest.raises(kairos.KairosError) as e2:
                await c.submit(name, 1, {"n": "seven"})
            assert e2.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert e2.value.field is not None and e2.value.field.startswith("inputs"), e2.value

            # An output over 32 KiB fails the attempt (not retried), naming `output`.
            w = kairos.Worker(c, name)

            @w.handler(name)
            async def big(task: kairos.Task) -> Any:
                return {"blob": "y" * 40_000}

            async with Running(w):
                s = await c.submit(name, 1)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_FAILED and done.attempt_count == 1
            assert done.error.message.startswith("output: ") and "32768" in done.error.message

    run(body)


def test_results_are_chunked_to_the_node_limits() -> None:
    rs = [api.TaskResult(execution_id=f"e{i}", fencing_token=i, success=api.Success()) for i in range(2_500)]
    chunks = _result_chunks(rs)
    assert [len(c) for c in chunks] == [1000, 1000, 500]
    big = [api.TaskResult(execution_id=f"e{i}", success=api.Success(output_json="x" * 30_000)) for i in range(100)]
    chunks = _result_chunks(big)
    assert all(sum(r.ByteSize() for r in c) <= 1024 * 1024 for c in chunks) and sum(map(len, chunks)) == 100


def test_blocking_handlers_run_in_the_thread_pool_and_see_cancellation(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-threads")
            await apply(c, name, lease="3s")
            threads: set[str] = set()
            started = threading.Event()
            w = kairos.Worker(c, name, concurrency=4, threads=2)

            @w.handler(name)
            def blocking(task: kairos.Task) -> Any:
                threads.add(threading.current_thread().name)
                if task.inputs.get("n") == 0:
                    started.set()
                    stopped = task.cancel_event().wait(20)
                    raise kairos.NonRetryableError("stopped" if stopped else "never cancelled", code="cancelled")
                time.sleep(0.05)
                return {"n": task.inputs["n"]}

            async with Running(w):
                subs = [kairos.Submission(name, 1, {"n": i}) for i in range(1, 7)]
                ids = [r.execution_id for r in await c.submit_many(subs) if isinstance(r, api.SubmitResponse)]
                for i, eid in enumerate(ids, 1):
                    done = await c.wait(eid, 20)
                    assert done.status == api.EXECUTION_STATUS_SUCCEEDED and json.loads(done.output_json) == {"n": i}
                s = await c.submit(name, 1, {"n": 0})
                await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
                await c.cancel(s.execution_id)
                done = await c.wait(s.execution_id, 15)
            assert done.status == api.EXECUTION_STATUS_CANCELLED, done
            assert threads and all(t.startswith("kairos-handler") for t in threads) and len(threads) <= 2

    run(body)


def test_a_handler_over_its_timeout_fails_retryably(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-timeout")
            await apply(c, name, max_attempts=2)
            w = kairos.Worker(c, name)
            seen: list[int] = []

            @w.handler(name, timeout=0.3)
            async def slow(task: kairos.Task) -> Any:
                seen.append(task.attempt)
                await asyncio.sleep(0 if task.attempt == 2 else 10)
                return {"attempt": task.attempt}

            async with Running(w):
                s = await c.submit(name, 1)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED and seen == [1, 2]
            first = (await c.get(s.execution_id)).attempts[0]
            assert first.error.code == "timeout" and first.error.retryable and "0.3 s" in first.error.message

    run(body)


def test_graceful_shutdown_drains_the_running_tasks(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-drain")
            await apply(c, name)
            started = asyncio.Event()
            w = kairos.Worker(c, name, concurrency=3)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                started.set()
                await asyncio.sleep(0.5)
                return {"n": task.inputs["n"]}

            r = Running(w)
            ids = [(await c.submit(name, 1, {"n": i})).execution_id for i in range(3)]
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            w.stop()
            await asyncio.wait_for(r.task, 15)
            assert time.monotonic() - t0 >= 0.3  # it waited for the handlers
            assert w.applied == 3, (w.started, w.applied)
            for eid in ids:
                assert (await c.get(eid)).execution.status == api.EXECUTION_STATUS_SUCCEEDED
            # Stopped: a new submission stays READY (nobody takes it).
            s = await c.submit(name, 1, {"n": 9})
            await asyncio.sleep(0.3)
            assert (await c.get(s.execution_id)).execution.status == api.EXECUTION_STATUS_READY

    run(body)


def test_replay_definitions_and_traceparent(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-replay")
            await apply(c, name, max_attempts=1)
            again = await c.apply_definition(test_conformance.definition(name, max_attempts=1))
            assert not again.created  # the same version again: a no-op
            d = await c.get_definition(name)
            assert d.version == 1 and d.retry_policy.max_attempts == 1
            assert any(x.name == name for x in await c.list_definitions())
            tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            traces: list[str] = []
            w = kairos.Worker(c, name)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                traces.append(task.traceparent)
                if task.attempt == 1:
                    raise RuntimeError("first time fails")
                return {"attempt": task.attempt}

            async with Running(w):
                s = await c.submit(name, 1, traceparent=tp)
                failed = await c.wait(s.execution_id, 20)
                assert failed.status == api.EXECUTION_STATUS_FAILED
                assert failed.error.message == "RuntimeError: first time fails" and failed.error.retryable
                await c.replay(s.execution_id)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED and done.attempt_count == 2
            assert traces == [tp, tp] and done.traceparent == tp
            with pytest.raises(kairos.KairosError) as e:
                await c.cancel(s.execution_id)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION

    run(body)


def test_backfill_and_trigger(dev_target: Target) -> None:
    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-backfill")
            await apply(c, name)
            job = unique("py-bf")
            await c.create_cron(name, 1, "0 * * * *", cron_job_id=job)
            now = int(time.time() * 1000)
            hour = 3_600_000
            start = (now // hour - 3) * hour
            r = await c.backfill_cron(job, start, start + 3 * hour, overlap="allow")
            assert list(r.occurrences_ms) == [start, start + hour, start + 2 * hour]
            deadline = time.monotonic() + 10
            while len((await c.cron_runs(job)).executions) < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            t = await c.trigger_cron(job, overlap="allow")
            assert t.idempotency_key.startswith(f"cron:{job}:")
            # Materialized through the cron service's outbox: shortly after the reply.
            deadline = time.monotonic() + 10
            while True:
                try:
                    made = (await c.get_by_key(t.idempotency_key)).execution
                    break
                except kairos.KairosError as e:
                    assert e.code == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, e
                    await asyncio.sleep(0.1)
            assert made.cron_job_id == job and made.cron_occurrence_ms == t.occurrence_ms
            assert any(j.cron_job_id == job for j in (await c.list_cron()).cron_jobs)

    run(body)


def test_the_five_minute_example_runs(dev_target: Target, tmp_path: Any) -> None:
    """The first Python block of docs/sdk-python.md, as a user would run it."""
    import re
    import subprocess
    import sys

    from conftest import REPO

    doc = (REPO / "docs/sdk-python.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S)
    assert code is not None
    script = tmp_path / "hello.py"
    script.write_text(code.group(1).replace("http://127.0.0.1:7071", dev_target.grpc))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == 'EXECUTION_STATUS_SUCCEEDED {"greeting":"Hello, Ada!"}', p.stdout


def test_a_result_made_while_the_node_is_down_is_sent_after_reconnecting(tmp_path: Any) -> None:
    """The node is SIGKILLed while a handler runs; the handler finishes while it is down; the
    node restarts on the same store and ports; the worker reconnects by itself and the result
    it kept is applied (the attempt's own, attempt 1)."""
    import signal

    from conftest import start_dev

    node = start_dev(tmp_path)

    async def body() -> None:
        async with node.client() as c:
            name = unique("py-reconnect")
            await apply(c, name)
            started = asyncio.Event()
            release = asyncio.Event()
            acks: list[kairos.Ack] = []
            w = kairos.Worker(c, name, on_ack=acks.append)

            @w.handler(name)
            async def h(task: kairos.Task) -> Any:
                started.set()
                await release.wait()
                return {"attempt": task.attempt}

            async with Running(w):
                s = await c.submit(name, 1)
                await asyncio.wait_for(started.wait(), 10)
                await asyncio.sleep(0.3)  # its first heartbeat
                node.proc.send_signal(signal.SIGKILL)
                node.proc.wait()
                release.set()
                await asyncio.sleep(0.5)  # the result is made and kept, unacknowledged
                assert not acks
                http, grpc_port = node.extra["ports"]
                again = start_dev(tmp_path, http, grpc_port)
                node.proc = again.proc
                done = await c.wait(s.execution_id, 30)
                assert done.status == api.EXECUTION_STATUS_SUCCEEDED, done
                assert done.attempt_count == 1 and json.loads(done.output_json) == {"attempt": 1}
                deadline = time.monotonic() + 10
                while not acks:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                assert acks[0].applied and acks[0].execution_id == s.execution_id

    try:
        run(body)
    finally:
        node.proc.terminate()
        node.proc.wait(10)


def test_poll_heartbeat_and_report_split_at_the_node_limit(dev_target: Target) -> None:
    """The unary worker calls: 1,005 tasks polled, reported in one `report` call that the SDK
    splits into Report calls of at most 1,000 (the node refuses more); every one applied, and
    a repeat of a result (same fencing token) is still code 0 (idempotent)."""

    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-report")
            await apply(c, name)
            results = await c.submit_many([kairos.Submission(name, 1, {"n": i}) for i in range(1005)])
            assert all(isinstance(r, api.SubmitResponse) for r in results)
            tasks: list[api.Task] = []
            deadline = time.monotonic() + 20
            while len(tasks) < 1005:
                assert time.monotonic() < deadline, len(tasks)
                tasks += await c.poll(name, worker_id="py-poller", max_executions=256, wait=1.0)
            hb = await c.heartbeat(tasks[0], worker_id="py-poller")
            assert hb.lease_remaining_ms > 0 and not hb.cancel_requested
            out = [api.TaskResult(execution_id=t.execution_id, fencing_token=t.fencing_token,
                                  success=api.Success(output_json='{"ok":true}')) for t in tasks]
            acks = await c.report(out, worker_id="py-poller")
            assert len(acks) == 1005 and all(a.code == 0 for a in acks), [a for a in acks if a.code][:3]
            assert [a.execution_id for a in acks] == [t.execution_id for t in tasks]
            again = await c.report(out[:1], worker_id="py-poller")
            assert again[0].code == 0
            stale = api.TaskResult(execution_id=tasks[1].execution_id, fencing_token=tasks[1].fencing_token + 7,
                                   success=api.Success())
            fenced = await c.report([stale], worker_id="py-poller")
            assert fenced[0].code == grpc.StatusCode.FAILED_PRECONDITION.value[0], fenced

    run(body)


def test_heartbeats_keep_a_task_longer_than_its_lease(dev_target: Target) -> None:
    """Lease 1 s, a handler of 3.5 s: the worker's heartbeats (a third of the lease) keep the
    attempt; it succeeds as attempt 1, never handed to anyone else."""

    async def body() -> None:
        async with dev_target.client() as c:
            name = unique("py-long")
            await apply(c, name, lease="1s")
            runs: list[int] = []
            w = kairos.Worker(c, name)

            @w.handler(name)
            async def long(task: kairos.Task) -> Any:
                runs.append(task.attempt)
                await asyncio.sleep(3.5)
                return {"attempt": task.attempt}

            async with Running(w):
                s = await c.submit(name, 1)
                done = await c.wait(s.execution_id, 20)
            assert done.status == api.EXECUTION_STATUS_SUCCEEDED and done.attempt_count == 1, done
            assert runs == [1] and w.applied == 1 and w.fenced == 0

    run(body)


def test_a_worker_whose_tls_cannot_work_stops_with_the_reason(serve_target: Target) -> None:
    """Mutual TLS without a client certificate, and a node certificate not trusted: the
    worker's run() raises (tls_failure) instead of retrying forever."""

    async def body() -> None:
        assert serve_target.tls is not None
        for tls in (kairos.Tls(ca_cert=serve_target.tls.ca_cert), kairos.Tls()):
            async with kairos.Client(serve_target.grpc, api_key=serve_target.worker_key, tls=tls) as c:
                w = kairos.Worker(c, "anything")
                with pytest.raises(kairos.KairosError) as e:
                    await asyncio.wait_for(w.run(), 10)
                assert e.value.tls_failure and e.value.code == grpc.StatusCode.UNAVAILABLE, e.value

    run(body)

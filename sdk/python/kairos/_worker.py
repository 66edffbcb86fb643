"""The worker: one ``Work`` stream per queue, credits = free slots, results batched per
event-loop tick and re-sent across reconnects until acknowledged or fenced."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

import grpc
import grpc.aio

from kairos.v1 import api_pb2 as pb

from ._client import Client
from ._errors import KairosError, LimitError, TaskFailure
from ._limits import ERROR_MESSAGE_BYTES_MAX, MESSAGE_ITEMS_MAX, OUTPUT_BYTES_MAX, RESULTS_MESSAGE_BYTES_MAX

log = logging.getLogger("kairos.worker")

HEARTBEAT_TICK = 0.1
_EMPTY_SUCCESS = pb.Success()
SHUTDOWN_ACK_WAIT = 10.0
_FENCED: int = grpc.StatusCode.FAILED_PRECONDITION.value[0]
# The end of a stream's messages (not in grpc's type stubs).
_EOF: Any = getattr(grpc.aio, "EOF")
_FATAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class Task:
    """An attempt handed to a handler. ``raw`` is the node's ``Task`` message."""

    __slots__ = ("raw", "_cancelled", "_aio_event", "_thread_event", "_loop", "_inputs")

    def __init__(self, raw: pb.Task, loop: asyncio.AbstractEventLoop) -> None:
        self.raw = raw
        self._cancelled = False
        self._aio_event: Optional[asyncio.Event] = None
        self._thread_event: Optional[threading.Event] = None
        self._loop = loop
        self._inputs: Any = None

    @property
    def execution_id(self) -> str:
        return self.raw.execution_id

    @property
    def attempt(self) -> int:
        """This attempt's number (1 for the first)."""
        return self.raw.attempt

    @property
    def definition(self) -> str:
        """The definition's name."""
        uri = self.raw.definition_uri
        return uri[len("registry://jobs/") :] if uri.startswith("registry://jobs/") else uri

    @property
    def inputs(self) -> Any:
        """The inputs, parsed from JSON."""
        if self._inputs is None:
            self._inputs = json.loads(self.raw.inputs_json) if self.raw.inputs_json else {}
        return self._inputs

    @property
    def traceparent(self) -> str:
        return self.raw.traceparent

    @property
    def cancelled(self) -> bool:
        """True once the handler should stop: a client cancelled the execution, the lease was
        lost, the handler's time-out passed, or the worker is shutting down hard."""
        return self._cancelled

    async def wait_cancelled(self) -> None:
        """Returns when :attr:`cancelled` becomes true (async handlers)."""
        if self._cancelled:
            return
        if self._aio_event is None:
            self._aio_event = asyncio.Event()
        await self._aio_event.wait()

    def cancel_event(self) -> threading.Event:
        """A :class:`threading.Event` set on cancellation (blocking handlers)."""
        if self._thread_event is None:
            self._thread_event = threading.Event()
            if self._cancelled:
                self._thread_event.set()
        return self._thread_event

    def _cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self._aio_event is not None:
            self._aio_event.set()
        if self._thread_event is not None:
            self._thread_event.set()


Handler = Callable[[Task], Union[Awaitable[Any], Any]]


@dataclass(frozen=True)
class Ack:
    """The node's answer to one result: ``fenced`` when the attempt was no longer this
    worker's (a later attempt took over; the result changed nothing)."""

    execution_id: str
    code: int
    message: str
    status: int

    @property
    def fenced(self) -> bool:
        return self.code == _FENCED

    @property
    def applied(self) -> bool:
        return self.code == 0


@dataclass
class _HandlerSpec:
    fn: Handler
    is_async: bool
    timeout: Optional[float]


class _Running:
    __slots__ = ("token", "next_beat", "lease_s", "task", "future", "timer", "timed_out")

    def __init__(self, token: int, next_beat: float, lease_s: float, task: Task) -> None:
        self.token = token
        self.next_beat = next_beat
        self.lease_s = lease_s
        self.task = task
        self.future: Optional[asyncio.Future[Any]] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timed_out = False


class Worker:
    """Runs the tasks of one queue.

    ``concurrency`` tasks at once (the credits of its one ``Work`` stream); ``lease`` seconds
    per task (default: the definition's). Register handlers with :meth:`handle` (or the
    :meth:`handler` decorator): an ``async def`` runs on the event loop; a plain function is
    blocking and runs in a thread pool of ``threads`` threads (default ``concurrency``).
    ``on_ack`` is called with each :class:`Ack`. :meth:`run` runs until :meth:`stop`.
    ``heartbeats=False`` sends none (for tests of lease loss only).
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        *,
        concurrency: int = 16,
        worker_id: Optional[str] = None,
        lease: Optional[float] = None,
        threads: Optional[int] = None,
        on_ack: Optional[Callable[[Ack], None]] = None,
        heartbeats: bool = True,
    ) -> None:
        if concurrency < 1:
            raise LimitError("concurrency", f"must be at least 1, got {concurrency}")
        self.client = client
        self.queue = queue
        self.concurrency = concurrency
        self.worker_id = worker_id or f"py-{socket.gethostname()}-{os.getpid()}"
        self.lease_ms = int(lease * 1000) if lease else 0
        self.threads = threads or concurrency
        self.on_ack = on_ack
        self.heartbeats = heartbeats
        self._handlers: dict[str, _HandlerSpec] = {}
        self._by_uri: dict[str, Optional[_HandlerSpec]] = {}
        self._fallback: Optional[_HandlerSpec] = None
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._stopping = False
        self._stop_event: Optional[asyncio.Event] = None
        self._running: dict[str, _Running] = {}
        self._unacked: dict[str, pb.TaskResult] = {}
        self._done: list[pb.TaskResult] = []
        self._flush_scheduled = False
        self._out: Optional[asyncio.Queue[Optional[pb.WorkRequest]]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[asyncio.Event] = None
        #: Counters: tasks started, results acknowledged as applied, fenced, refused.
        self.started = 0
        self.applied = 0
        self.fenced = 0
        self.refused = 0

    def handle(self, definition: Optional[str], fn: Handler, *, timeout: Optional[float] = None) -> "Worker":
        """Runs tasks of ``definition`` (its name; ``None``: any definition without a handler of
        its own) with ``fn``. ``timeout`` (seconds): the attempt fails retryably with code
        ``timeout`` when the handler takes longer (an async handler is cancelled; a blocking one
        sees ``task.cancelled``)."""
        spec = _HandlerSpec(fn, inspect.iscoroutinefunction(fn), timeout)
        if definition is None:
            self._fallback = spec
        else:
            self._handlers[definition] = spec
        self._by_uri.clear()
        return self

    def handler(self, definition: Optional[str], *, timeout: Optional[float] = None) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`handle`."""

        def register(fn: Handler) -> Handler:
            self.handle(definition, fn, timeout=timeout)
            return fn

        return register

    def stop(self) -> None:
        """Graceful shutdown: takes no more tasks, lets the running ones finish and report, and
        waits (up to 10 s) for their acknowledgements; then :meth:`run` returns. Thread-safe."""
        loop = self._loop
        if loop is None:
            self._stopping = True
            return
        loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ---- the stream ------------------------------------------------------------------------

    async def run(self) -> None:
        """Takes tasks and runs them until :meth:`stop`. Reconnects by itself when the stream
        breaks (backing off up to 2 s); raises :class:`KairosError` when the node refuses the
        worker (bad settings, a key without the ``worker`` scope, TLS that fails: see
        :attr:`KairosError.tls_failure`)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        if any(not h.is_async for h in self._all_handlers()):
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="kairos-handler")
        backoff = 0.1
        give_up_at: Optional[float] = None
        try:
            while True:
                if self._stopping and not self._running and not self._done:
                    if not self._unacked:
                        return
                    # Stopping with results the node has not acknowledged, and no stream: try
                    # for SHUTDOWN_ACK_WAIT, then give up (the attempts are retried after
                    # their lease).
                    now = time.monotonic()
                    give_up_at = give_up_at or now + SHUTDOWN_ACK_WAIT
                    if now > give_up_at:
                        log.warning("kairos worker %s: %d results unacknowledged at shutdown", self.worker_id, len(self._unacked))
                        return
                try:
                    clean = await self._one_stream()
                    backoff = 0.1
                    if clean:
                        return
                except grpc.aio.AioRpcError as e:
                    err = KairosError.from_rpc(e)
                    if e.code() in _FATAL or err.tls_failure:
                        # A bad setting, a key the node refuses, or TLS that cannot work (the
                        # node's certificate not trusted, ours refused): retrying cannot help.
                        raise err from None
                    log.info("kairos worker %s: stream broke (%s: %s); reconnecting", self.worker_id, e.code().name, e.details())
                except KairosError as e:
                    if e.code in _FATAL:
                        raise
                    log.info("kairos worker %s: stream ended (%s); reconnecting", self.worker_id, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        finally:
            for r in self._running.values():
                if r.future is not None and not r.future.done():
                    r.future.cancel()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)

    def _all_handlers(self) -> list[_HandlerSpec]:
        return list(self._handlers.values()) + ([self._fallback] if self._fallback else [])

    async def _one_stream(self) -> bool:
        """One ``Work`` stream, until it breaks (False) or the worker has stopped (True)."""
        assert self._loop is not None and self._wake is not None
        out: asyncio.Queue[Optional[pb.WorkRequest]] = asyncio.Queue()
        self._out = out
        credits = 0 if self._stopping else max(0, self.concurrency - len(self._running))
        first = pb.WorkRequest(
            open=pb.WorkOpen(
                namespace=self.client.namespace,
                queue=self.queue,
                worker_id=self.worker_id,
                credits=credits,
                lease_ms=self.lease_ms,
            )
        )
        chunks = _result_chunks(list(self._unacked.values()))
        if chunks:
            first.results.extend(chunks[0])
        out.put_nowait(first)
        for c in chunks[1:]:
            out.put_nowait(pb.WorkRequest(results=c))
        now = time.monotonic()
        for r in self._running.values():
            r.next_beat = now
        call = self.client.workers.Work(metadata=self.client.metadata)
        writer = asyncio.ensure_future(self._write(call, out))
        beats = asyncio.ensure_future(self._heartbeat_loop())
        closer = asyncio.ensure_future(self._close_when_drained(out))
        try:
            while True:
                m = await call.read()
                if m is _EOF:
                    break
                self._on_response(m)
            # The node ended the stream. Clean when we half-closed it after draining.
            if closer.done() and not closer.cancelled() and closer.result():
                return True
            code = await call.code()
            if code in _FATAL:
                raise KairosError(code, await call.details())
            return False
        finally:
            self._out = None
            for t in (writer, beats, closer):
                t.cancel()
            if not call.done():
                call.cancel()

    async def _write(self, call: Any, out: "asyncio.Queue[Optional[pb.WorkRequest]]") -> None:
        try:
            while True:
                m = await out.get()
                if m is None:
                    await call.done_writing()
                    return
                # What queued up during the last write goes in this one message (within the
                # node's limits): fewer, larger writes when the stream is busy.
                end = False
                while not out.empty():
                    n = out.get_nowait()
                    if n is None:
                        end = True
                        break
                    if not _fits(m, n):
                        await call.write(m)
                        m = n
                        continue
                    credits = m.credits + n.credits
                    m.MergeFrom(n)
                    m.credits = credits
                await call.write(m)
                if end:
                    await call.done_writing()
                    return
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            call.cancel()

    async def _close_when_drained(self, out: "asyncio.Queue[Optional[pb.WorkRequest]]") -> bool:
        """Once stopping and everything is reported and acknowledged (or 10 s passed after the
        last task ended), half-closes the stream."""
        assert self._stop_event is not None and self._wake is not None
        await self._stop_event.wait()
        # No more credits: tell the node nothing; it holds what it had, and sends nothing
        # more once those are used. Wait for the running ones and their acks.
        deadline: Optional[float] = None
        while True:
            if not self._running and not self._done:
                if not self._unacked:
                    break
                if deadline is None:
                    deadline = time.monotonic() + SHUTDOWN_ACK_WAIT
                elif time.monotonic() > deadline:
                    log.warning("kairos worker %s: %d results unacknowledged at shutdown", self.worker_id, len(self._unacked))
                    break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
        out.put_nowait(None)
        return True

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_TICK)
            if not self.heartbeats or self._out is None:
                continue
            now = time.monotonic()
            due: list[pb.TaskRef] = []
            for eid, r in self._running.items():
                if r.next_beat <= now:
                    # Not again before the answer could come back.
                    r.next_beat = now + max(r.lease_s / 3, HEARTBEAT_TICK)
                    due.append(pb.TaskRef(execution_id=eid, fencing_token=r.token))
            for i in range(0, len(due), MESSAGE_ITEMS_MAX):
                self._out.put_nowait(pb.WorkRequest(heartbeats=due[i : i + MESSAGE_ITEMS_MAX]))

    def _on_response(self, m: pb.WorkResponse) -> None:
        unacked = self._unacked
        on_ack = self.on_ack
        for ack in m.acks:
            unacked.pop(ack.execution_id, None)
            code = ack.code
            if code == 0:
                self.applied += 1
            elif code == _FENCED:
                self.fenced += 1
                log.info("kairos worker %s: result of %s fenced out: %s", self.worker_id, ack.execution_id, ack.message)
            else:
                self.refused += 1
                log.warning("kairos worker %s: result of %s refused: %s", self.worker_id, ack.execution_id, ack.message)
            if on_ack is not None:
                on_ack(Ack(ack.execution_id, code, ack.message, ack.status))
        if m.acks:
            self._poke()
        for hb in m.heartbeats:
            r = self._running.get(hb.execution_id)
            if r is None:
                continue
            if hb.code != 0 or hb.cancel_requested:
                # Cancelled by a client, or the lease is no longer ours: stop the handler.
                self._cancel_running(r)
            if hb.code == 0:
                r.next_beat = time.monotonic() + max(hb.lease_remaining_ms / 3000, HEARTBEAT_TICK)
        if m.tasks:
            now = time.monotonic()
            loop = self._loop
            assert loop is not None
            for t in m.tasks:
                self._start(t, now, loop)

    def _cancel_running(self, r: _Running) -> None:
        r.task._cancel()
        spec = self._spec(r.task.raw.definition_uri)
        if r.future is not None and spec is not None and spec.is_async:
            r.future.cancel()

    def _spec(self, uri: str) -> Optional[_HandlerSpec]:
        try:
            return self._by_uri[uri]
        except KeyError:
            name = uri[len("registry://jobs/") :] if uri.startswith("registry://jobs/") else uri
            spec = self._by_uri[uri] = self._handlers.get(name) or self._fallback
            return spec

    def _start(self, t: pb.Task, now: float, loop: asyncio.AbstractEventLoop) -> None:
        task = Task(t, loop)
        r = _Running(t.fencing_token, now + HEARTBEAT_TICK, max(t.lease_ms, 1000) / 1000, task)
        self._running[t.execution_id] = r
        self.started += 1
        spec = self._spec(t.definition_uri)
        if spec is None:
            self._finish(r, _failure(f"no handler for definition {task.definition!r} on worker {self.worker_id}", False, "no-handler"))
            return
        if spec.is_async:
            # One asyncio task per attempt, which reports by itself (no done-callback hop).
            r.future = loop.create_task(self._run_async(r, spec))
        else:
            assert self._pool is not None
            fut = loop.run_in_executor(self._pool, spec.fn, task)
            r.future = fut
            fut.add_done_callback(functools.partial(self._on_blocking_done, r, spec))
        if spec.timeout is not None:
            r.timer = loop.call_later(spec.timeout, self._time_out, r)

    async def _run_async(self, r: _Running, spec: _HandlerSpec) -> None:
        outcome: Union[pb.Success, pb.ExecutionError]
        try:
            value = await spec.fn(r.task)
        except asyncio.CancelledError:
            outcome = self._cancelled_outcome(r, spec)
        except BaseException as e:  # noqa: BLE001 - every failure of a handler is reported
            outcome = _outcome_of(e)
        else:
            outcome = _success(value)
        if r.timer is not None:
            r.timer.cancel()
        self._finish(r, outcome)

    def _on_blocking_done(self, r: _Running, spec: _HandlerSpec, f: "asyncio.Future[Any]") -> None:
        if r.timer is not None:
            r.timer.cancel()
        outcome: Union[pb.Success, pb.ExecutionError]
        if r.timed_out or f.cancelled():
            outcome = self._cancelled_outcome(r, spec)
        else:
            e = f.exception()
            outcome = _success(f.result()) if e is None else _outcome_of(e)
        self._finish(r, outcome)

    @staticmethod
    def _cancelled_outcome(r: _Running, spec: _HandlerSpec) -> pb.ExecutionError:
        if r.timed_out:
            return _failure(f"the handler took longer than its time-out of {spec.timeout} s", True, "timeout")
        return _failure("cancelled", False, "cancelled")

    def _time_out(self, r: _Running) -> None:
        r.timed_out = True
        r.task._cancel()
        if r.future is not None and not r.future.done():
            r.future.cancel()

    def _finish(self, r: _Running, outcome: Union[pb.Success, pb.ExecutionError]) -> None:
        t = r.task.raw
        if outcome is _EMPTY_SUCCESS:
            result = pb.TaskResult(execution_id=t.execution_id, fencing_token=t.fencing_token, success=_EMPTY_SUCCESS)
            if t.namespace:
                result.namespace = t.namespace
        elif isinstance(outcome, pb.Success):
            result = pb.TaskResult(execution_id=t.execution_id, fencing_token=t.fencing_token, success=outcome, namespace=t.namespace)
        else:
            result = pb.TaskResult(execution_id=t.execution_id, fencing_token=t.fencing_token, failure=outcome, namespace=t.namespace)
        self._done.append(result)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Sends the results finished during this event-loop tick, with their credits."""
        self._flush_scheduled = False
        done, self._done = self._done, []
        for res in done:
            self._running.pop(res.execution_id, None)
            self._unacked[res.execution_id] = res
        if self._out is not None:
            for chunk in _result_chunks(done):
                credits = 0 if self._stopping else len(chunk)
                self._out.put_nowait(pb.WorkRequest(credits=credits, results=chunk))
        # Without a stream, the results wait in `_unacked` for the next one.
        self._poke()


def _outcome_of(e: BaseException) -> pb.ExecutionError:
    if isinstance(e, TaskFailure):
        return _failure(e.message, e.retryable, e.code)
    if isinstance(e, asyncio.CancelledError):
        return _failure("cancelled", False, "cancelled")
    return _failure(f"{type(e).__name__}: {e}", True, "exception")


def _success(value: Any) -> Union[pb.Success, pb.ExecutionError]:
    if value is None:
        return _EMPTY_SUCCESS
    try:
        text = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        return _failure(f"output: not JSON-serializable: {e}", False, "output")
    size = len(text.encode())
    if size > OUTPUT_BYTES_MAX:
        return _failure(
            f"output: {size} bytes of JSON; at most {OUTPUT_BYTES_MAX} are accepted", False, "output-too-large"
        )
    return pb.Success(output_json=text)


def _failure(message: str, retryable: bool, code: str) -> pb.ExecutionError:
    raw = message.encode()
    if len(raw) > ERROR_MESSAGE_BYTES_MAX:
        message = raw[: ERROR_MESSAGE_BYTES_MAX - 3].decode(errors="ignore") + "..."
    return pb.ExecutionError(message=message, retryable=retryable, code=code)


def _fits(m: pb.WorkRequest, n: pb.WorkRequest) -> bool:
    """Whether ``n`` may join ``m`` in one message."""
    return (
        not n.HasField("open")
        and len(m.results) + len(n.results) <= MESSAGE_ITEMS_MAX
        and len(m.heartbeats) + len(n.heartbeats) <= MESSAGE_ITEMS_MAX
        and (not n.results or m.ByteSize() + n.ByteSize() <= RESULTS_MESSAGE_BYTES_MAX)
    )


def _result_chunks(results: list[pb.TaskResult]) -> list[list[pb.TaskResult]]:
    """Results in messages of at most 1,000 and about 1 MiB (a result alone may pass it)."""
    out: list[list[pb.TaskResult]] = []
    size = 0
    for r in results:
        n = r.ByteSize() + 8
        if out and len(out[-1]) < MESSAGE_ITEMS_MAX and size + n <= RESULTS_MESSAGE_BYTES_MAX:
            out[-1].append(r)
            size += n
        else:
            out.append([r])
            size = n
    return out

"""The client: every Kairos gRPC call, over ``grpc.aio``, with the API key on each call."""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, List, Mapping, Optional, Sequence, TypeVar, Union

import grpc
import grpc.aio

from kairos.v1 import api_pb2 as pb
from kairos.v1 import api_pb2_grpc

from ._errors import KairosError, LimitError
from ._limits import INPUTS_BYTES_MAX, LIST_PAGE_MAX, MESSAGE_ITEMS_MAX, RECEIVE_BYTES_MAX, SUBMIT_BATCH_MAX

T = TypeVar("T")

# The generated service stubs carry no type hints.
rpc: Any = api_pb2_grpc

#: When: an absolute time (aware datetime, or ms since the epoch as int).
When = Union[_dt.datetime, int]
#: A delay: seconds (float) or a timedelta.
Delay = Union[float, int, _dt.timedelta]

TERMINAL = (
    pb.EXECUTION_STATUS_SUCCEEDED,
    pb.EXECUTION_STATUS_FAILED,
    pb.EXECUTION_STATUS_CANCELLED,
)


def definition_uri(definition: str) -> str:
    """``registry://jobs/<name>`` for a name; a URI as it is."""
    return definition if definition.startswith("registry://") else f"registry://jobs/{definition}"


def _ms(when: When, name: str) -> int:
    if isinstance(when, _dt.datetime):
        if when.tzinfo is None:
            raise LimitError(name, "a datetime needs a time zone (e.g. datetime.now(timezone.utc))")
        return int(when.timestamp() * 1000)
    if isinstance(when, int) and not isinstance(when, bool):
        return when
    raise LimitError(name, f"expected a datetime or milliseconds since the epoch, got {when!r}")


def _delay_ms(after: Delay) -> int:
    s = after.total_seconds() if isinstance(after, _dt.timedelta) else float(after)
    if s < 0:
        raise LimitError("delay", f"must not be negative, got {s} s")
    return int(round(s * 1000))


def _inputs_json(inputs: Any) -> str:
    if inputs is None:
        return "{}"
    text = inputs if isinstance(inputs, str) else json.dumps(inputs, separators=(",", ":"))
    size = len(text.encode())
    if size > INPUTS_BYTES_MAX:
        raise LimitError("inputs", f"{size} bytes of JSON; at most {INPUTS_BYTES_MAX} are accepted")
    return text


@dataclass
class Submission:
    """One submit, for :meth:`Client.submit_many` (the same fields as :meth:`Client.submit`)."""

    definition: str
    version: int
    inputs: Any = None
    at: Optional[When] = None
    after: Optional[Delay] = None
    idempotency_key: Optional[str] = None
    traceparent: str = ""
    namespace: Optional[str] = None

    def request(self, namespace: str) -> pb.SubmitRequest:
        if self.at is not None and self.after is not None:
            raise LimitError("at", "give `at` or `after`, not both")
        req = pb.SubmitRequest(
            namespace=self.namespace or namespace,
            definition_uri=definition_uri(self.definition),
            definition_version=self.version,
            inputs_json=_inputs_json(self.inputs),
            idempotency_key=self.idempotency_key or f"py-{uuid.uuid4().hex}",
            traceparent=self.traceparent,
        )
        if self.at is not None:
            req.execute_at_ms = _ms(self.at, "at")
        else:
            req.delay_ms = _delay_ms(self.after or 0)
        return req


@dataclass
class Tls:
    """TLS towards an ``https://`` endpoint: ``ca_cert`` (PEM file) to verify the node against
    instead of the system roots; ``client_cert`` and ``client_key`` (PEM files, both or
    neither) for a node requiring mutual TLS."""

    ca_cert: Optional[Union[str, Path]] = None
    client_cert: Optional[Union[str, Path]] = None
    client_key: Optional[Union[str, Path]] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.client_cert is None) != (self.client_key is None):
            raise LimitError("client_cert", "a client certificate and its key go together: give both or neither")

        def read(what: str, p: Optional[Union[str, Path]]) -> Optional[bytes]:
            if p is None:
                return None
            try:
                return Path(p).read_bytes()
            except OSError as e:
                raise LimitError(what, f"cannot read {p}: {e.strerror}") from e

        return grpc.ssl_channel_credentials(
            root_certificates=read("ca_cert", self.ca_cert),
            private_key=read("client_key", self.client_key),
            certificate_chain=read("client_cert", self.client_cert),
        )


def _target(endpoint: str) -> tuple[str, bool]:
    if endpoint.startswith("https://"):
        return endpoint[len("https://") :].rstrip("/"), True
    if endpoint.startswith("http://"):
        return endpoint[len("http://") :].rstrip("/"), False
    if "://" in endpoint:
        raise LimitError("endpoint", f"expected http://host:port or https://host:port, got {endpoint!r}")
    return endpoint, False


class Client:
    """A connection to a Kairos node.

    ``endpoint``: ``http://host:port`` (plaintext) or ``https://host:port`` (TLS, see
    :class:`Tls`); default ``$KAIROS_ENDPOINT`` or ``http://127.0.0.1:7071``. ``api_key``
    (default ``$KAIROS_API_KEY``) is sent on every call as ``authorization: Bearer …``.
    ``timeout`` bounds each call (seconds). Use ``async with Client(...) as c`` or
    ``await c.close()``.
    """

    def __init__(
        self,
        endpoint: Optional[str] = None,
        *,
        namespace: Optional[str] = None,
        api_key: Optional[str] = None,
        tls: Optional[Tls] = None,
        timeout: float = 30.0,
    ) -> None:
        endpoint = endpoint or os.environ.get("KAIROS_ENDPOINT") or "http://127.0.0.1:7071"
        target, secure = _target(endpoint)
        if tls is not None and not secure:
            raise LimitError("tls", f"TLS options need an https:// endpoint, got {endpoint!r}")
        self.endpoint = endpoint
        self.namespace = namespace or os.environ.get("KAIROS_NAMESPACE") or "default"
        self.timeout = timeout
        key = api_key if api_key is not None else os.environ.get("KAIROS_API_KEY")
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {key}"),) if key else ()
        self._tls = tls
        options = [
            ("grpc.max_receive_message_length", RECEIVE_BYTES_MAX),
            ("grpc.max_send_message_length", RECEIVE_BYTES_MAX),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # A restarted node is found again within a second or two.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if secure:
            self.channel = grpc.aio.secure_channel(target, (tls or Tls()).credentials(), options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.executions = rpc.ExecutionServiceStub(self.channel)
        self.workers = rpc.WorkerServiceStub(self.channel)
        self.definitions = rpc.DefinitionServiceStub(self.channel)
        self.cron = rpc.CronServiceStub(self.channel)
        self.admin = rpc.AdminServiceStub(self.channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata sent with every call (the API key)."""
        return self._metadata

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close(None)

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any, timeout: Optional[float] = None) -> T:
        try:
            return await method(request, metadata=self._metadata, timeout=timeout or self.timeout)
        except grpc.aio.AioRpcError as e:
            raise KairosError.from_rpc(e) from None

    # ---- executions ------------------------------------------------------------------------

    async def submit(
        self,
        definition: str,
        version: int,
        inputs: Any = None,
        *,
        at: Optional[When] = None,
        after: Optional[Delay] = None,
        idempotency_key: Optional[str] = None,
        traceparent: str = "",
        namespace: Optional[str] = None,
        return_execution: bool = False,
    ) -> pb.SubmitResponse:
        """Submits one execution of ``definition`` (a name or ``registry://jobs/<name>``) at
        version ``version``: at ``at``, or ``after`` a delay counted by the node's clock, or due
        now. Without an idempotency key the SDK makes one up, so the retries it makes when the
        outcome is unknown (node unreachable, time-out; up to 3) create at most one execution."""
        req = Submission(definition, version, inputs, at, after, idempotency_key, traceparent, namespace).request(
            self.namespace
        )
        req.return_execution = return_execution
        for attempt in range(4):
            try:
                return await self._call(self.executions.Submit, req)
            except KairosError as e:
                if not e.transient or attempt == 3:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def submit_many(self, submissions: Sequence[Submission]) -> List[Union[pb.SubmitResponse, KairosError]]:
        """Submits many executions, 1,000 per ``SubmitBatch`` call; one result per submission, in
        order: its reply, or the :class:`KairosError` that item failed with."""
        out: List[Union[pb.SubmitResponse, KairosError]] = []
        requests = [s.request(self.namespace) for s in submissions]
        for i in range(0, len(requests), SUBMIT_BATCH_MAX):
            batch = pb.SubmitBatchRequest(requests=requests[i : i + SUBMIT_BATCH_MAX])
            reply: pb.SubmitBatchResponse = await self._call(self.executions.SubmitBatch, batch)
            for item in reply.items:
                if item.WhichOneof("result") == "ok":
                    out.append(item.ok)
                else:
                    out.append(KairosError(_status(item.error.code), item.error.message))
        return out

    async def get(self, execution_id: str, *, namespace: Optional[str] = None) -> pb.GetExecutionResponse:
        """An execution and its attempts (the first 100; see ``attempts_next_cursor``)."""
        req = pb.GetExecutionRequest(namespace=namespace or self.namespace, execution_id=execution_id)
        return await self._call(self.executions.Get, req)

    async def get_by_key(self, idempotency_key: str, *, namespace: Optional[str] = None) -> pb.GetExecutionResponse:
        """The execution submitted with ``idempotency_key``, and its attempts."""
        req = pb.GetExecutionRequest(namespace=namespace or self.namespace, idempotency_key=idempotency_key)
        return await self._call(self.executions.Get, req)

    async def cancel(self, execution_id: str, *, namespace: Optional[str] = None) -> pb.CancelResponse:
        """Cancels it: at once if it has not started, else by asking its worker to stop."""
        ref = pb.ExecutionRef(namespace=namespace or self.namespace, execution_id=execution_id)
        return await self._call(self.executions.Cancel, ref)

    async def replay(self, execution_id: str, *, namespace: Optional[str] = None) -> pb.Execution:
        """Runs a FAILED execution again, as its next attempt."""
        ref = pb.ExecutionRef(namespace=namespace or self.namespace, execution_id=execution_id)
        reply: pb.ExecutionResponse = await self._call(self.executions.Replay, ref)
        return reply.execution

    async def list(
        self,
        *,
        status: "pb.ExecutionStatus | str" = pb.EXECUTION_STATUS_UNSPECIFIED,
        definition: str = "",
        from_: Optional[When] = None,
        to: Optional[When] = None,
        limit: int = 100,
        cursor: bytes = b"",
        namespace: Optional[str] = None,
    ) -> pb.ListExecutionsResponse:
        """One page of executions (``next_cursor`` empty at the end; a page may be short)."""
        if not 1 <= limit <= LIST_PAGE_MAX:
            raise LimitError("limit", f"must be 1 to {LIST_PAGE_MAX}, got {limit}")
        req = pb.ListExecutionsRequest(
            namespace=namespace or self.namespace,
            status=status,
            definition=definition_uri(definition) if definition else "",
            from_ms=_ms(from_, "from") if from_ is not None else 0,
            to_ms=_ms(to, "to") if to is not None else 0,
            limit=limit,
            cursor=cursor,
        )
        return await self._call(self.executions.List, req)

    async def list_all(self, **filters: Any) -> AsyncIterator[pb.Execution]:
        """Every execution matching ``filters`` (those of :meth:`list`), page after page."""
        cursor = b""
        while True:
            page = await self.list(cursor=cursor, **filters)
            for e in page.executions:
                yield e
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def wait(self, execution_id: str, timeout: float = 120.0, *, poll: float = 0.1) -> pb.Execution:
        """Polls until the execution is SUCCEEDED, FAILED or CANCELLED; ``TimeoutError`` after
        ``timeout`` seconds. Transient errors (the node unreachable for a while) do not end it."""
        deadline = asyncio.get_running_loop().time() + timeout
        last = "unknown"
        while True:
            try:
                e = (await self.get(execution_id)).execution
                if e.status in TERMINAL:
                    return e
                last = pb.ExecutionStatus.Name(e.status)
            except KairosError as err:
                # The node restarting or briefly unreachable: keep polling until the deadline.
                if not err.transient:
                    raise
                last = f"unknown ({err})"
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"execution {execution_id} still {last} after {timeout} s")
            await asyncio.sleep(poll)

    # ---- the worker protocol's unary calls ------------------------------------------------

    async def poll(self, queue: str, *, worker_id: str, max_executions: int = 1, wait: float = 0.0, lease: float = 0.0,
                   namespace: Optional[str] = None) -> List[pb.Task]:
        """Long poll (for simple workers; :class:`~kairos.Worker` streams instead): up to
        ``max_executions`` READY tasks, waiting up to ``wait`` seconds for the first."""
        req = pb.PollRequest(namespace=namespace or self.namespace, queue=queue, worker_id=worker_id,
                             max_executions=max_executions, lease_ms=int(lease * 1000), wait_ms=int(wait * 1000))
        reply: pb.PollResponse = await self._call(self.workers.Poll, req, timeout=self.timeout + wait)
        return [*reply.tasks]

    async def heartbeat(self, task: pb.Task, *, worker_id: str) -> pb.HeartbeatResponse:
        req = pb.HeartbeatRequest(namespace=task.namespace or self.namespace, execution_id=task.execution_id,
                                  fencing_token=task.fencing_token, worker_id=worker_id)
        return await self._call(self.workers.Heartbeat, req)

    async def report(self, results: Sequence[pb.TaskResult], *, worker_id: str, namespace: Optional[str] = None) -> List[pb.ResultAck]:
        """Results of many attempts, 1,000 per ``Report`` call (the node's limit); one
        acknowledgement per result, in order (code 0 applied, ``FAILED_PRECONDITION`` fenced)."""
        acks: List[pb.ResultAck] = []
        for i in range(0, len(results), MESSAGE_ITEMS_MAX):
            req = pb.ReportRequest(namespace=namespace or self.namespace, results=results[i : i + MESSAGE_ITEMS_MAX], worker_id=worker_id)
            reply: pb.ReportResponse = await self._call(self.workers.Report, req)
            acks.extend(reply.acks)
        return acks

    # ---- definitions -----------------------------------------------------------------------

    async def apply_definition(self, source: Union[str, Path], *, namespace: Optional[str] = None) -> pb.RegisterDefinitionResponse:
        """Registers a definition: its YAML or JSON text, or a file (a :class:`~pathlib.Path`).
        Versions are immutable: the same again is a no-op (``created`` false); other content
        under the same version is ``ALREADY_EXISTS``."""
        text = source.read_text() if isinstance(source, Path) else source
        req = pb.RegisterDefinitionRequest(namespace=namespace or self.namespace, source=text)
        return await self._call(self.definitions.Register, req)

    async def get_definition(self, name: str, version: int = 0, *, namespace: Optional[str] = None) -> pb.Definition:
        """A definition (version 0: the latest)."""
        req = pb.GetDefinitionRequest(namespace=namespace or self.namespace, name=name, version=version)
        reply: pb.DefinitionResponse = await self._call(self.definitions.Get, req)
        return reply.definition

    async def list_definitions(self, *, namespace: Optional[str] = None) -> List[pb.Definition]:
        req = pb.ListDefinitionsRequest(namespace=namespace or self.namespace)
        reply: pb.ListDefinitionsResponse = await self._call(self.definitions.List, req)
        return [*reply.definitions]

    # ---- cron ------------------------------------------------------------------------------

    async def create_cron(
        self,
        definition: str,
        version: int,
        expression: str,
        *,
        timezone: str = "UTC",
        cron_job_id: str = "",
        inputs: Any = None,
        policies: Optional[pb.CronPolicies] = None,
        start_at: Optional[When] = None,
        end_at: Optional[When] = None,
        remaining_runs: int = 0,
        notes: str = "",
        paused: bool = False,
        namespace: Optional[str] = None,
    ) -> pb.CronJobResponse:
        """A durable schedule (docs/cron.md); ``policies`` a :class:`kairos.v1.api_pb2.CronPolicies`."""
        req = pb.CreateCronJobRequest(
            namespace=namespace or self.namespace,
            cron_job_id=cron_job_id,
            definition_uri=definition_uri(definition),
            definition_version=version,
            inputs_json=_inputs_json(inputs),
            expression=expression,
            timezone=timezone,
            policies=policies,
            start_at_ms=_ms(start_at, "start_at") if start_at is not None else 0,
            end_at_ms=_ms(end_at, "end_at") if end_at is not None else 0,
            remaining_runs=remaining_runs,
            notes=notes,
            paused=paused,
        )
        return await self._call(self.cron.Create, req)

    async def update_cron(self, cron_job_id: str, *, namespace: Optional[str] = None, **changes: Any) -> pb.CronJob:
        """Changes the given fields (those of ``UpdateCronJobRequest``: ``expression``,
        ``timezone``, ``inputs`` (JSON-able), ``definition_version``, ``overlap``, …)."""
        if "inputs" in changes:
            changes["inputs_json"] = _inputs_json(changes.pop("inputs"))
        if "definition" in changes:
            changes["definition_uri"] = definition_uri(changes.pop("definition"))
        try:
            req = pb.UpdateCronJobRequest(namespace=namespace or self.namespace, cron_job_id=cron_job_id, **changes)
        except ValueError as e:
            raise LimitError(str(e).split('"')[1] if '"' in str(e) else "changes", str(e)) from None
        reply: pb.CronJobResponse = await self._call(self.cron.Update, req)
        return reply.cron_job

    def _cron_ref(self, cron_job_id: str, namespace: Optional[str]) -> pb.CronJobRef:
        return pb.CronJobRef(namespace=namespace or self.namespace, cron_job_id=cron_job_id)

    async def pause_cron(self, cron_job_id: str, *, namespace: Optional[str] = None) -> pb.CronJob:
        reply: pb.CronJobResponse = await self._call(self.cron.Pause, self._cron_ref(cron_job_id, namespace))
        return reply.cron_job

    async def resume_cron(self, cron_job_id: str, *, catch_up: bool = False, namespace: Optional[str] = None) -> pb.CronJob:
        req = pb.ResumeCronJobRequest(namespace=namespace or self.namespace, cron_job_id=cron_job_id, catch_up=catch_up)
        reply: pb.CronJobResponse = await self._call(self.cron.Resume, req)
        return reply.cron_job

    async def delete_cron(self, cron_job_id: str, *, namespace: Optional[str] = None) -> None:
        await self._call(self.cron.Delete, self._cron_ref(cron_job_id, namespace))

    async def get_cron(self, cron_job_id: str, *, namespace: Optional[str] = None) -> pb.CronJob:
        reply: pb.CronJobResponse = await self._call(self.cron.Get, self._cron_ref(cron_job_id, namespace))
        return reply.cron_job

    async def list_cron(self, *, limit: int = 100, cursor: str = "", namespace: Optional[str] = None) -> pb.ListCronJobsResponse:
        req = pb.ListCronJobsRequest(namespace=namespace or self.namespace, limit=limit, cursor=cursor)
        return await self._call(self.cron.List, req)

    async def preview_cron(
        self,
        expression: str,
        *,
        timezone: str = "UTC",
        from_: Optional[When] = None,
        until: Optional[When] = None,
        limit: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
    ) -> List[pb.Occurrence]:
        """The occurrences of ``expression`` in [from_, until) (default: the next day)."""
        now = int(_dt.datetime.now(_dt.timezone.utc).timestamp() * 1000)
        start = _ms(from_, "from") if from_ is not None else now
        req = pb.PreviewRequest(
            expression=expression,
            timezone=timezone,
            dst_gap=dst_gap,
            dst_fold=dst_fold,
            from_ms=start,
            until_ms=_ms(until, "until") if until is not None else start + 86_400_000,
            limit=limit,
        )
        reply: pb.PreviewResponse = await self._call(self.cron.Preview, req)
        return [*reply.occurrences]

    async def backfill_cron(
        self, cron_job_id: str, from_: When, until: When, *, overlap: str = "", namespace: Optional[str] = None
    ) -> pb.BackfillResponse:
        req = pb.BackfillRequest(
            namespace=namespace or self.namespace,
            cron_job_id=cron_job_id,
            from_ms=_ms(from_, "from"),
            until_ms=_ms(until, "until"),
            overlap=overlap,
        )
        return await self._call(self.cron.Backfill, req)

    async def trigger_cron(self, cron_job_id: str, *, overlap: str = "", namespace: Optional[str] = None) -> pb.TriggerResponse:
        req = pb.TriggerRequest(namespace=namespace or self.namespace, cron_job_id=cron_job_id, overlap=overlap)
        return await self._call(self.cron.Trigger, req)

    async def cron_runs(
        self, cron_job_id: str, *, limit: int = 100, cursor: bytes = b"", namespace: Optional[str] = None
    ) -> pb.ListExecutionsResponse:
        """The executions of the job's occurrences, oldest first."""
        req = pb.CronRunsRequest(namespace=namespace or self.namespace, cron_job_id=cron_job_id, limit=limit, cursor=cursor)
        return await self._call(self.cron.Runs, req)

    # ---- access ----------------------------------------------------------------------------

    async def create_api_key(self, scopes: Sequence[str], *, name: str = "", namespace: Optional[str] = None) -> tuple[pb.ApiKey, str]:
        """A new key of ``namespace`` (``"*"``: every namespace) with ``scopes`` (submit, read,
        worker, definitions, admin); returns the key and its token (shown only now)."""
        req = pb.CreateApiKeyRequest(namespace=namespace or self.namespace, scopes=list(scopes), name=name)
        reply: pb.CreateApiKeyResponse = await self._call(self.admin.CreateApiKey, req)
        return reply.key, reply.token

    async def list_api_keys(self, *, namespace: str = "") -> List[pb.ApiKey]:
        reply: pb.ListApiKeysResponse = await self._call(self.admin.ListApiKeys, pb.ListApiKeysRequest(namespace=namespace))
        return [*reply.keys]

    async def revoke_api_key(self, key_id: str) -> pb.ApiKey:
        reply: pb.ApiKeyResponse = await self._call(self.admin.RevokeApiKey, pb.RevokeApiKeyRequest(id=key_id))
        return reply.key

    async def who_am_i(self) -> pb.WhoAmIResponse:
        return await self._call(self.admin.WhoAmI, pb.Empty())

    async def limits(self, *, namespace: Optional[str] = None) -> pb.LimitsResponse:
        return await self._call(self.admin.Limits, pb.LimitsRequest(namespace=namespace or self.namespace))

    async def audit_log(self, *, limit: int = 100, namespace: Optional[str] = None) -> List[pb.AuditEntry]:
        reply: pb.AuditLogResponse = await self._call(
            self.admin.AuditLog, pb.AuditLogRequest(namespace=namespace or self.namespace, limit=limit)
        )
        return [*reply.entries]

    async def stats(self, *, namespace: str = "") -> Mapping[str, int]:
        reply: pb.StatsResponse = await self._call(self.admin.Stats, pb.StatsRequest(namespace=namespace))
        return {pb.ExecutionStatus.Name(c.status): c.count for c in reply.executions}


def _status(code: int) -> grpc.StatusCode:
    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c
    return grpc.StatusCode.UNKNOWN

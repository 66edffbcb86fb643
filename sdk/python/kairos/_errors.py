"""The SDK's errors: every failure of a call is a :class:`KairosError` carrying the gRPC code."""

from __future__ import annotations

import re
from typing import Optional

import grpc

# The node's messages start with the field at fault: "executeAt: is more than 10 years ...",
# "inputs.report_date: expected date ...", "expression: minute field: 61 is out of range".
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]-]*): ")


class KairosError(Exception):
    """A call failed. ``code`` is the gRPC status code, ``field`` the request field at fault
    when the message names one (the node's messages start with it), ``message`` the text."""

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str] = None) -> None:
        if field is None:
            m = _FIELD.match(message)
            field = m.group(1) if m else None
        self.code = code
        self.message = message
        self.field = field
        super().__init__(f"{code.name}: {message}")

    @property
    def transient(self) -> bool:
        """Whether the same request may succeed when retried (node unreachable, time-out, a
        broken connection): the outcome of such a call is unknown."""
        return self.code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.ABORTED,
        )

    @property
    def tls_failure(self) -> bool:
        """Whether TLS failed in a way retrying does not mend: this client does not trust the
        node's certificate, or the node refused this client's (mutual TLS: none given, or one
        its client CA did not sign — under TLS 1.3 seen as a corrupted record after the
        handshake)."""
        m = self.message
        return self.code == grpc.StatusCode.UNAVAILABLE and any(
            s in m for s in ("Tls handshake failed", "CERTIFICATE_VERIFY_FAILED", "TSI_DATA_CORRUPTED", "SSL_ERROR_SSL")
        )

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> "KairosError":
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


class LimitError(KairosError, ValueError):
    """A request refused on this side before sending: over one of the node's limits (the
    field and the limit named), or an invalid argument."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", field)


def _code_of(value: int) -> grpc.StatusCode:
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c
    return grpc.StatusCode.UNKNOWN


class TaskFailure(Exception):
    """Raised by a handler: the attempt fails. ``retryable`` failures are retried by the
    scheduler (up to the definition's ``max_attempts``); see :class:`NonRetryableError`."""

    retryable = True

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class RetryableError(TaskFailure):
    """The attempt failed; another attempt may succeed (any other exception means the same)."""


class NonRetryableError(TaskFailure):
    """The attempt failed and no retry will fix it: the execution ends FAILED at once."""

    retryable = False

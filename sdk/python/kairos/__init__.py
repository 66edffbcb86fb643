"""Kairos SDK for Python: a :class:`Client` for every gRPC call and an asyncio :class:`Worker`.

The API's own messages are in :mod:`kairos.v1.api_pb2` (generated from ``proto/`` when the
package is built)."""

from kairos.v1 import api_pb2 as api

from ._client import TERMINAL, Client, Submission, Tls, definition_uri
from ._errors import KairosError, LimitError, NonRetryableError, RetryableError, TaskFailure
from ._limits import INPUTS_BYTES_MAX, MESSAGE_ITEMS_MAX, OUTPUT_BYTES_MAX
from ._worker import Ack, Task, Worker

__all__ = [
    "api",
    "Ack",
    "Client",
    "INPUTS_BYTES_MAX",
    "KairosError",
    "LimitError",
    "MESSAGE_ITEMS_MAX",
    "NonRetryableError",
    "OUTPUT_BYTES_MAX",
    "RetryableError",
    "Submission",
    "TERMINAL",
    "Task",
    "TaskFailure",
    "Tls",
    "Worker",
    "definition_uri",
]

"""The node's bounds the SDK checks or respects before sending (see docs/sdk-python.md)."""

#: Inputs of a submit, bytes of JSON (the node's global limit; a namespace may set less).
INPUTS_BYTES_MAX = 32 * 1024
#: A handler's output, bytes of JSON.
OUTPUT_BYTES_MAX = 32 * 1024
#: Results, or heartbeats, in one ``Work`` message or ``Report`` (the node refuses more).
MESSAGE_ITEMS_MAX = 1_000
#: Bytes of results in one ``Work`` message (a quarter of the node's 4 MiB decode limit).
RESULTS_MESSAGE_BYTES_MAX = 1024 * 1024
#: Requests in one ``SubmitBatch`` call.
SUBMIT_BATCH_MAX = 1_000
#: Executions (or cron jobs) in one list page.
LIST_PAGE_MAX = 1_000
#: The largest message taken from a node (tasks come in 1 MiB chunks; a list page may be more).
RECEIVE_BYTES_MAX = 64 * 1024 * 1024
#: An error message kept with a failed attempt, in bytes (longer ones are cut).
ERROR_MESSAGE_BYTES_MAX = 4 * 1024

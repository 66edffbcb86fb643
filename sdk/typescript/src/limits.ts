/** The node's bounds the SDK checks before sending (units last). */

/** Inputs of one submission, and a handler's output, in bytes of JSON. */
export const INPUT_BYTES_MAX = 32 * 1024;
export const OUTPUT_BYTES_MAX = 32 * 1024;
/** Requests in one SubmitBatch. */
export const SUBMIT_BATCH_MAX = 1_000;
/** Results, and heartbeats, in one Work message (the node refuses more). */
export const MESSAGE_ITEMS_MAX = 1_000;
/** Bytes of results in one Work message (a result alone may pass it). */
export const RESULTS_MESSAGE_BYTES_MAX = 1024 * 1024;
/** The largest message taken from a node (tasks come in chunks of 1 MiB; pages may be larger). */
export const DECODE_BYTES_MAX = 64 * 1024 * 1024;
/** Most executions in one list page. */
export const LIST_PAGE_MAX = 1_000;

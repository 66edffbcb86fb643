import { status as Status } from "@grpc/grpc-js";

/** gRPC code names by number (`status.NOT_FOUND` = 5 → "NOT_FOUND"). */
export const CODE_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(Status).filter(([, v]) => typeof v === "number").map(([k, v]) => [v as number, k]),
);

/**
 * What a call to the node, or a check made before calling, failed with: the gRPC `code`
 * (`codeName` spells it), the node's message, and the `field` it names when it names one
 * (`inputs.report_date`, `executeAt`, `results`…).
 */
export class KairosError extends Error {
  readonly code: number;
  readonly codeName: string;
  readonly field: string | undefined;
  readonly details: string;

  constructor(code: number, details: string, field?: string) {
    const name = CODE_NAMES[code] ?? `CODE_${code}`;
    super(`${name}: ${details}`);
    this.name = "KairosError";
    this.code = code;
    this.codeName = name;
    this.details = details;
    this.field = field ?? fieldOf(details);
  }

  /**
   * Whether TLS failed in a way retrying does not mend: the node refused this client's
   * certificate (none given, or one its client CA did not sign), or this client does not
   * trust the node's certificate.
   */
  get tlsFailure(): boolean {
    return /alert (certificate required|bad certificate|unknown ca|certificate unknown|decrypt error|handshake failure)|unable to verify|self[- ]signed certificate|certificate has expired|certificate verify failed|Hostname\/IP does not match|ERR_TLS_CERT/i
      .test(this.details);
  }

  /** Whether repeating the call may succeed (the node unreachable, no answer in time, the connection broken). */
  get transient(): boolean {
    return [Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.UNKNOWN, Status.CANCELLED, Status.ABORTED]
      .includes(this.code);
  }
}

/** The field a node's message starts with (`inputs.x: expected int…`, `executeAt: is more…`). */
function fieldOf(message: string): string | undefined {
  const m = /^([A-Za-z_][A-Za-z0-9_]*(?:[.[\]][A-Za-z0-9_\]]*)*): /.exec(message);
  return m ? m[1] : undefined;
}

/** A setting or argument refused before anything is sent (INVALID_ARGUMENT, naming `field`). */
export function invalid(field: string, reason: string): KairosError {
  return new KairosError(Status.INVALID_ARGUMENT, `${field}: ${reason}`, field);
}

/** A grpc-js call error as a KairosError. */
export function fromGrpc(e: unknown): KairosError {
  if (e instanceof KairosError) return e;
  const err = e as { code?: number; details?: string; message?: string };
  if (typeof err?.code === "number") {
    return new KairosError(err.code, err.details || err.message || "");
  }
  return new KairosError(Status.UNKNOWN, String(err?.message ?? e));
}

/** Thrown by a handler: the attempt fails and is not retried (the execution ends FAILED). */
export class NonRetryableError extends Error {
  readonly code: string;
  constructor(message: string, options?: { code?: string }) {
    super(message);
    this.name = "NonRetryableError";
    this.code = options?.code ?? "";
  }
}

/** Thrown by a handler to fail the attempt retryably with a machine-readable `code` (any other error is retryable too). */
export class RetryableError extends Error {
  readonly code: string;
  constructor(message: string, options?: { code?: string }) {
    super(message);
    this.name = "RetryableError";
    this.code = options?.code ?? "";
  }
}

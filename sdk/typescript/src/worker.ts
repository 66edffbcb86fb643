import { EventEmitter } from "node:events";
import { hostname } from "node:os";
import * as grpc from "@grpc/grpc-js";

import type { Task__Output } from "./generated/kairos/v1/Task";
import type { TaskResult } from "./generated/kairos/v1/TaskResult";
import type { WorkRequest } from "./generated/kairos/v1/WorkRequest";
import type { WorkResponse__Output } from "./generated/kairos/v1/WorkResponse";
import type { Client } from "./client";
import { KairosError, NonRetryableError, RetryableError, fromGrpc, invalid } from "./errors";
import { MESSAGE_ITEMS_MAX, OUTPUT_BYTES_MAX, RESULTS_MESSAGE_BYTES_MAX } from "./limits";

/** How often due heartbeats are looked for, in ms. */
const HEARTBEAT_TICK_MS = 100;
/** How long a graceful shutdown waits for the last results' acknowledgements, in ms. */
const SHUTDOWN_ACK_WAIT_MS = 10_000;

/** An attempt handed to a handler. */
export class Task {
  /** The task as the node sent it (64-bit fields as decimal strings). */
  readonly raw: Task__Output;
  private inputsCache: unknown;
  private controller: AbortController | undefined;
  private abortReason: string | undefined;

  /** @internal */
  constructor(raw: Task__Output) {
    this.raw = raw;
  }

  get executionId(): string { return this.raw.executionId; }
  /** This attempt's number (1 for the first). */
  get attempt(): number { return this.raw.attempt; }
  get fencingToken(): string { return this.raw.fencingToken; }
  /** The definition's name (from `registry://jobs/<name>`). */
  get definitionName(): string { return definitionName(this.raw.definitionUri); }
  get traceparent(): string { return this.raw.traceparent; }
  get idempotencyKey(): string { return this.raw.idempotencyKey; }
  /** The inputs, parsed from JSON. */
  get inputs(): any {
    if (this.inputsCache === undefined) this.inputsCache = this.raw.inputsJson ? JSON.parse(this.raw.inputsJson) : {};
    return this.inputsCache;
  }
  /** The definition's opaque `execution` block, parsed. */
  get definitionExecution(): any {
    return this.raw.definitionExecutionJson ? JSON.parse(this.raw.definitionExecutionJson) : null;
  }
  /**
   * Aborted when the handler should stop: a client cancelled the execution, the lease was
   * lost (the attempt is no longer this worker's), or the handler's time-out passed. Its
   * `reason` says which (`cancelled`, `lease lost`, `timeout`).
   */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.abortReason !== undefined) this.controller.abort(this.abortReason);
    }
    return this.controller.signal;
  }
  /** Whether the signal is aborted. */
  get cancelled(): boolean { return this.abortReason !== undefined; }
  /** Why it was aborted (`cancelled`, `lease lost`, `timeout`, `worker stopped`), if it was. */
  get cancelReason(): string | undefined { return this.abortReason; }

  /** @internal */
  abort(reason: string): void {
    if (this.abortReason !== undefined) return;
    this.abortReason = reason;
    this.controller?.abort(reason);
  }
}

export function definitionName(uri: string): string {
  return uri.startsWith("registry://jobs/") ? uri.slice("registry://jobs/".length) : uri;
}

/** A handler: resolves with the output (a JSON value, or undefined for none) or throws. */
export type Handler = (task: Task) => unknown | Promise<unknown>;

export interface HandlerOptions {
  /** The attempt fails (retryably, code `timeout`) this long after it started; its signal is aborted. */
  timeoutMs?: number;
}

export interface WorkerOptions {
  /** The queue (a definition's `queue`, by default its name). */
  queue: string;
  /** Default `<hostname>-<pid>`. */
  workerId?: string;
  /** Tasks at once: the stream's credits (default 16). */
  concurrency?: number;
  /** The lease each task gets (default: the definition's). */
  leaseMs?: number;
  /** A time-out for every handler without its own. */
  handlerTimeoutMs?: number;
  /** Send heartbeats (default true). `false` only to test fencing: tasks then lose their leases. */
  heartbeats?: boolean;
}

/** An acknowledgement the node refused: `fenced` (the attempt was no longer this worker's) or `refused`. */
export interface RefusedResult {
  executionId: string;
  code: number;
  message: string;
}

interface Running {
  task: Task;
  token: string;
  nextBeat: number;
  leaseMs: number;
  timer: NodeJS.Timeout | undefined;
  done: boolean;
}

/**
 * A worker of one queue over one `Work` stream. Events: `fenced` and `refused`
 * ({@link RefusedResult}: a result the node did not apply), `acked` (executionId, status),
 * `disconnected` (a KairosError; it reconnects by itself), `warning` (a message).
 */
export class Worker extends EventEmitter {
  readonly queue: string;
  readonly workerId: string;
  readonly concurrency: number;
  private readonly client: Client;
  private readonly leaseMs: number;
  private readonly defaultTimeoutMs: number | undefined;
  private readonly beats: boolean;
  private readonly handlers = new Map<string, { fn: Handler; timeoutMs: number | undefined }>();
  private fallbackHandler: { fn: Handler; timeoutMs: number | undefined } | undefined;

  private readonly running = new Map<string, Running>();
  /** Sent (or to send) and not yet acknowledged: sent again on a new stream. */
  private readonly unacked = new Map<string, TaskResult>();
  private pending: TaskResult[] = [];
  private pendingCredits = 0;
  private flushScheduled = false;
  private call: grpc.ClientDuplexStream<WorkRequest, WorkResponse__Output> | undefined;
  private generation = 0;
  private backoffMs = 100;
  private tick: NodeJS.Timeout | undefined;
  private stopping = false;
  private stopDeadline = 0;
  private started = false;
  private finished = false;
  private resolveRun: (() => void) | undefined;
  private rejectRun: ((e: Error) => void) | undefined;
  private runPromise: Promise<void> | undefined;

  constructor(client: Client, options: WorkerOptions) {
    super();
    if (!options.queue) throw invalid("queue", "is required");
    const concurrency = options.concurrency ?? 16;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 100_000) {
      throw invalid("concurrency", `must be an integer 1..100000, not ${concurrency}`);
    }
    this.client = client;
    this.queue = options.queue;
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}`;
    this.concurrency = concurrency;
    this.leaseMs = options.leaseMs ?? 0;
    this.defaultTimeoutMs = options.handlerTimeoutMs;
    this.beats = options.heartbeats ?? true;
  }

  /** Runs tasks of definition `name` with `handler`. */
  handle(name: string, handler: Handler, options: HandlerOptions = {}): this {
    this.handlers.set(name, { fn: handler, timeoutMs: options.timeoutMs ?? this.defaultTimeoutMs });
    return this;
  }

  /** Runs tasks of any other definition of the queue. */
  fallback(handler: Handler, options: HandlerOptions = {}): this {
    this.fallbackHandler = { fn: handler, timeoutMs: options.timeoutMs ?? this.defaultTimeoutMs };
    return this;
  }

  /** Tasks running now. */
  get inFlight(): number { return this.running.size; }

  /**
   * Starts working; the promise resolves once {@link stop} has drained the worker, and
   * rejects when the node refuses the worker for good (a bad setting, a key it refuses or
   * that lacks the `worker` scope). A broken stream is reconnected by itself.
   */
  run(): Promise<void> {
    if (this.runPromise) return this.runPromise;
    this.runPromise = new Promise<void>((resolve, reject) => {
      this.resolveRun = resolve;
      this.rejectRun = reject;
    });
    this.started = true;
    this.tick = setInterval(() => this.onTick(), HEARTBEAT_TICK_MS);
    this.connect();
    return this.runPromise;
  }

  /**
   * Graceful shutdown: takes no more work (tasks the node still sends are given back
   * unstarted), lets running handlers finish, waits for their results' acknowledgements
   * (up to 10 s), then closes the stream. Resolves when done.
   */
  async stop(): Promise<void> {
    if (!this.started) return;
    if (!this.stopping) {
      this.stopping = true;
      this.stopDeadline = Number.POSITIVE_INFINITY;
    }
    this.maybeFinish();
    await this.runPromise;
  }

  // ---- the stream ------------------------------------------------------------------------

  private connect(): void {
    if (this.finished) return;
    const gen = ++this.generation;
    const call = this.client.workers.Work(this.client.metadata(), {});
    this.call = call;
    const credits = this.stopping ? 0 : Math.max(0, this.concurrency - this.running.size);
    const resend = chunkResults([...this.unacked.values()]);
    call.write({
      open: { namespace: this.client.namespace, queue: this.queue, workerId: this.workerId, credits, leaseMs: this.leaseMs },
      results: resend.shift() ?? [],
    });
    for (const results of resend) call.write({ results });
    // Every running task beats at the first tick: a restarted node learns they reached a worker.
    const now = Date.now();
    for (const r of this.running.values()) r.nextBeat = now;
    call.on("data", (m: WorkResponse__Output) => {
      if (gen !== this.generation) return;
      this.backoffMs = 100;
      this.onResponse(m);
    });
    const broken = (e: unknown) => {
      if (gen !== this.generation) return;
      this.generation++;
      this.call = undefined;
      if (this.finished) return;
      const err = e ? fromGrpc(e) : new KairosError(grpc.status.UNAVAILABLE, "the Work stream ended");
      // A bad setting, a key the node refuses, or TLS refused either way: retrying cannot help.
      if ([grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED].includes(err.code) || err.tlsFailure) {
        this.finish(err);
        return;
      }
      this.emit("disconnected", err);
      if (this.stopping && this.running.size === 0 && this.unacked.size === 0) {
        this.finish();
        return;
      }
      setTimeout(() => this.connect(), this.backoffMs);
      this.backoffMs = Math.min(this.backoffMs * 2, 2_000);
    };
    call.on("error", broken);
    call.on("end", () => broken(undefined));
    if (this.pending.length) this.flush();
  }

  private onResponse(m: WorkResponse__Output): void {
    for (const ack of m.acks) {
      this.unacked.delete(ack.executionId);
      if (ack.code === 0) {
        if (this.listenerCount("acked")) this.emit("acked", ack.executionId, ack.status);
      } else {
        const r: RefusedResult = { executionId: ack.executionId, code: ack.code, message: ack.message };
        if (ack.code === grpc.status.FAILED_PRECONDITION) this.emit("fenced", r);
        else {
          this.emit("refused", r);
          this.emit("warning", `result of ${ack.executionId} refused: ${ack.message}`);
        }
      }
    }
    for (const hb of m.heartbeats) {
      const r = this.running.get(hb.executionId);
      if (!r) continue;
      if (hb.code !== 0) r.task.abort("lease lost");
      else {
        if (hb.cancelRequested) r.task.abort("cancelled");
        r.nextBeat = Date.now() + Math.max(Number(hb.leaseRemainingMs) / 3, HEARTBEAT_TICK_MS);
      }
    }
    if (m.tasks.length) {
      const now = Date.now();
      for (const t of m.tasks) this.start(t, now);
    }
    if (this.stopping) this.maybeFinish();
  }

  private start(t: Task__Output, now: number): void {
    if (this.stopping) {
      // Taken after the stop: given back unstarted (READY again at once, not counted).
      this.push({ executionId: t.executionId, fencingToken: t.fencingToken, namespace: t.namespace, release: {} }, false);
      return;
    }
    const task = new Task(t);
    const entry: Running = {
      task,
      token: t.fencingToken,
      // The first beat at the next tick tells the node the task reached this worker; a task
      // done within the tick sends its result instead.
      nextBeat: now + HEARTBEAT_TICK_MS,
      leaseMs: Math.max(Number(t.leaseMs), 1_000),
      timer: undefined,
      done: false,
    };
    this.running.set(t.executionId, entry);
    const name = definitionName(t.definitionUri);
    const h = this.handlers.get(name) ?? this.fallbackHandler;
    if (!h) {
      this.finishTask(entry, new NonRetryableError(`no handler for definition "${name}" on worker ${this.workerId}`), true);
      return;
    }
    if (h.timeoutMs !== undefined) {
      const ms = h.timeoutMs;
      entry.timer = setTimeout(() => {
        task.abort("timeout");
        this.finishTask(entry, new RetryableError(`the handler did not finish within ${ms} ms`, { code: "timeout" }), true);
      }, ms);
    }
    let out: unknown;
    try {
      out = h.fn(task);
    } catch (e) {
      this.finishTask(entry, e, true);
      return;
    }
    if (out !== null && typeof out === "object" && typeof (out as Promise<unknown>).then === "function") {
      (out as Promise<unknown>).then((v) => this.finishTask(entry, v, false), (e) => this.finishTask(entry, e, true));
    } else {
      this.finishTask(entry, out, false);
    }
  }

  private finishTask(entry: Running, value: unknown, failed: boolean): void {
    if (entry.done) return;
    entry.done = true;
    if (entry.timer) clearTimeout(entry.timer);
    const t = entry.task.raw;
    this.running.delete(t.executionId);
    const result: TaskResult = { executionId: t.executionId, fencingToken: entry.token, namespace: t.namespace };
    if (failed) {
      result.failure = failureOf(value, entry.task);
    } else {
      const outputJson = value === undefined || value === null ? "" : JSON.stringify(value);
      const size = outputJson.length <= OUTPUT_BYTES_MAX / 3 ? 0 : Buffer.byteLength(outputJson);
      if (size > OUTPUT_BYTES_MAX) {
        result.failure = { message: `output: is ${size} bytes of JSON, more than ${OUTPUT_BYTES_MAX}`, retryable: false, code: "output-too-large" };
      } else {
        result.success = { outputJson, outputReference: "" };
      }
    }
    this.push(result, true);
  }

  /** Queues a result; all results of one turn of the event loop go in one message. */
  private push(result: TaskResult, credit: boolean): void {
    this.pending.push(result);
    if (credit) this.pendingCredits++;
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => this.flush());
    }
  }

  private flush(): void {
    this.flushScheduled = false;
    const results = this.pending;
    let credits = this.stopping ? 0 : this.pendingCredits;
    this.pending = [];
    this.pendingCredits = 0;
    for (const r of results) this.unacked.set(r.executionId!, r);
    // Without a stream they wait, unacknowledged, for the next one (which sends them again),
    // and the slots they free are in that stream's opening credits.
    const call = this.call;
    if (call) {
      for (const chunk of chunkResults(results)) {
        call.write({ credits, results: chunk });
        credits = 0;
      }
    }
    if (this.stopping) this.maybeFinish();
  }

  private onTick(): void {
    const call = this.call;
    if (call && this.beats && this.running.size) {
      const now = Date.now();
      let due: Array<{ executionId: string; fencingToken: string }> = [];
      for (const [id, r] of this.running) {
        if (r.nextBeat > now) continue;
        // Not again before the answer could come back.
        r.nextBeat = now + Math.max(r.leaseMs / 3, HEARTBEAT_TICK_MS);
        due.push({ executionId: id, fencingToken: r.token });
        if (due.length === MESSAGE_ITEMS_MAX) {
          call.write({ heartbeats: due });
          due = [];
        }
      }
      if (due.length) call.write({ heartbeats: due });
    }
    if (this.stopping) this.maybeFinish();
  }

  private maybeFinish(): void {
    if (this.finished || !this.stopping) return;
    if (this.running.size || this.pending.length) return;
    if (this.unacked.size === 0) {
      this.finish();
      return;
    }
    if (this.stopDeadline === Number.POSITIVE_INFINITY) this.stopDeadline = Date.now() + SHUTDOWN_ACK_WAIT_MS;
    else if (Date.now() > this.stopDeadline) {
      this.emit("warning", `${this.unacked.size} results unacknowledged at shutdown`);
      this.finish();
    }
  }

  private finish(error?: KairosError): void {
    if (this.finished) return;
    this.finished = true;
    if (this.tick) clearInterval(this.tick);
    const call = this.call;
    this.generation++;
    this.call = undefined;
    if (call) {
      call.end();
      if (error) call.cancel();
    }
    for (const r of this.running.values()) {
      r.task.abort("worker stopped");
      if (r.timer) clearTimeout(r.timer);
    }
    if (error) this.rejectRun?.(error);
    else this.resolveRun?.();
  }
}

function failureOf(e: unknown, task: Task): { message: string; retryable: boolean; code: string } {
  if (e instanceof NonRetryableError) return { message: e.message, retryable: false, code: e.code };
  if (e instanceof RetryableError) return { message: e.message, retryable: true, code: e.code };
  if (task.cancelled && task.cancelReason !== "timeout") {
    // A handler that stopped on its signal: not retried; CANCELLED when a client asked.
    return { message: "cancelled", retryable: false, code: "cancelled" };
  }
  const message = e instanceof Error ? e.message : String(e);
  return { message: message || "handler failed", retryable: true, code: "" };
}

/** Results in messages of at most 1,000 and about 1 MiB (a result alone may pass it). */
function chunkResults(results: TaskResult[]): TaskResult[][] {
  const out: TaskResult[][] = [];
  let current: TaskResult[] = [];
  let bytes = 0;
  for (const r of results) {
    const size = 64 + (r.executionId?.length ?? 0) + (r.success?.outputJson?.length ?? 0) + (r.failure?.message?.length ?? 0);
    if (current.length && (current.length >= MESSAGE_ITEMS_MAX || bytes + size > RESULTS_MESSAGE_BYTES_MAX)) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(r);
    bytes += size;
  }
  if (current.length) out.push(current);
  return out;
}

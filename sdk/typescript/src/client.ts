import * as fs from "node:fs";
import * as path from "node:path";
import { randomUUID } from "node:crypto";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import type { ProtoGrpcType } from "./generated/api";
import type { ExecutionServiceClient } from "./generated/kairos/v1/ExecutionService";
import type { WorkerServiceClient } from "./generated/kairos/v1/WorkerService";
import type { DefinitionServiceClient } from "./generated/kairos/v1/DefinitionService";
import type { CronServiceClient } from "./generated/kairos/v1/CronService";
import type { AdminServiceClient } from "./generated/kairos/v1/AdminService";
import type { SubmitRequest } from "./generated/kairos/v1/SubmitRequest";
import type { SubmitResponse__Output } from "./generated/kairos/v1/SubmitResponse";
import type { SubmitBatchItem__Output } from "./generated/kairos/v1/SubmitBatchItem";
import type { Execution__Output } from "./generated/kairos/v1/Execution";
import type { Attempt__Output } from "./generated/kairos/v1/Attempt";
import type { CancelResponse__Output } from "./generated/kairos/v1/CancelResponse";
import type { ListExecutionsResponse__Output } from "./generated/kairos/v1/ListExecutionsResponse";
import type { Definition__Output } from "./generated/kairos/v1/Definition";
import type { CronJob__Output } from "./generated/kairos/v1/CronJob";
import type { CreateCronJobRequest } from "./generated/kairos/v1/CreateCronJobRequest";
import type { UpdateCronJobRequest } from "./generated/kairos/v1/UpdateCronJobRequest";
import type { CronJobResponse__Output } from "./generated/kairos/v1/CronJobResponse";
import type { Occurrence__Output } from "./generated/kairos/v1/Occurrence";
import type { BackfillResponse__Output } from "./generated/kairos/v1/BackfillResponse";
import type { TriggerResponse__Output } from "./generated/kairos/v1/TriggerResponse";
import type { ListCronJobsResponse__Output } from "./generated/kairos/v1/ListCronJobsResponse";
import type { CreateApiKeyResponse__Output } from "./generated/kairos/v1/CreateApiKeyResponse";
import type { ApiKey__Output } from "./generated/kairos/v1/ApiKey";
import type { AuditEntry__Output } from "./generated/kairos/v1/AuditEntry";
import type { WhoAmIResponse__Output } from "./generated/kairos/v1/WhoAmIResponse";
import type { LimitsResponse__Output } from "./generated/kairos/v1/LimitsResponse";
import type { ExecutionStatus } from "./generated/kairos/v1/ExecutionStatus";
import { KairosError, fromGrpc, invalid } from "./errors";
import { DECODE_BYTES_MAX, INPUT_BYTES_MAX, LIST_PAGE_MAX, SUBMIT_BATCH_MAX } from "./limits";

/** Loader options: 64-bit integers as exact decimal strings, enums by name, defaults filled. */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false, longs: String, enums: String, defaults: true, oneofs: true,
};

let loaded: ProtoGrpcType | undefined;
function api(): ProtoGrpcType {
  if (!loaded) {
    const file = path.join(__dirname, "..", "proto", "kairos", "v1", "api.proto");
    const def = protoLoader.loadSync(file, LOADER_OPTIONS);
    loaded = grpc.loadPackageDefinition(def) as unknown as ProtoGrpcType;
  }
  return loaded;
}

/** TLS settings: PEM contents (string/Buffer) or file paths. */
export interface TlsOptions {
  /** The CA that signed the node's certificate (default: the system roots). */
  ca?: string | Buffer;
  /** With `key`: this client's certificate, for nodes requiring mutual TLS. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** The name the node's certificate must carry, when it is not the endpoint's host. */
  serverName?: string;
}

export interface ClientOptions {
  /** `kai_…` sent as `authorization: Bearer kai_…` with every call (nodes run by `kairos serve` need one). */
  apiKey?: string;
  /** Default `default`. */
  namespace?: string;
  /** TLS options; need an `https://` endpoint. */
  tls?: TlsOptions;
  /** Client-side time-out of each call (default 30,000 ms). */
  timeoutMs?: number;
  /** Tries of a submit whose outcome is unknown, with the same idempotency key (default 3). */
  retries?: number;
}

export interface SubmitOptions {
  /** The inputs (a JSON object; at most 32 KiB once serialized). */
  inputs?: Record<string, unknown>;
  /** Run at this time (a Date or ms since the epoch). */
  at?: Date | number;
  /** Run after this delay, counted by the node's clock. Neither `at` nor `afterMs`: due now. */
  afterMs?: number;
  /** A repeat with the same key and request returns the same execution (the SDK makes one up otherwise). */
  idempotencyKey?: string;
  /** W3C trace context handed to every attempt's worker. */
  traceparent?: string;
  /** The definition version (default 1). */
  version?: number;
  /** Return the whole execution in the reply. */
  returnExecution?: boolean;
}

export interface ListOptions {
  status?: ExecutionStatus;
  /** `registry://jobs/<name>` or a bare name. */
  definition?: string;
  fromMs?: number;
  toMs?: number;
  /** At most 1,000. */
  limit?: number;
  /** The previous page's `nextCursor`. */
  cursor?: Buffer;
}

export type ExecutionPage = ListExecutionsResponse__Output;
export type ExecutionWithAttempts = { execution: Execution__Output; attempts: Attempt__Output[]; attemptsNextCursor: string };

/** `registry://jobs/<name>` for a bare name; a URI as it is. */
export function definitionUri(nameOrUri: string): string {
  return nameOrUri.includes("://") ? nameOrUri : `registry://jobs/${nameOrUri}`;
}

function readPem(v: string | Buffer | undefined, field: string): Buffer | null {
  if (v === undefined) return null;
  if (Buffer.isBuffer(v)) return v;
  if (v.includes("-----BEGIN")) return Buffer.from(v);
  try {
    return fs.readFileSync(v);
  } catch (e) {
    throw invalid(field, `cannot read ${v}: ${(e as Error).message}`);
  }
}

const TERMINAL = new Set(["EXECUTION_STATUS_SUCCEEDED", "EXECUTION_STATUS_FAILED", "EXECUTION_STATUS_CANCELLED"]);

type Unary<Req, Res> = (req: Req, md: grpc.Metadata, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r?: Res) => void) => unknown;

/**
 * A connection to a node's gRPC API. Every method returns a promise and rejects with a
 * {@link KairosError}. 64-bit fields (`executeAtMs`, `fencingToken`…) come back as decimal
 * strings (exact); requests take numbers or strings.
 */
export class Client {
  readonly namespace: string;
  readonly endpoint: string;
  readonly timeoutMs: number;
  /** @internal */ readonly target: string;
  /** @internal */ readonly credentials: grpc.ChannelCredentials;
  /** @internal */ readonly channelOptions: grpc.ChannelOptions;
  private readonly retries: number;
  private readonly options: ClientOptions;
  private readonly authorization: string | undefined;
  /** @internal */ readonly executions: ExecutionServiceClient;
  /** @internal */ readonly workers: WorkerServiceClient;
  private readonly definitions: DefinitionServiceClient;
  private readonly cron: CronServiceClient;
  private readonly admin: AdminServiceClient;

  /**
   * `endpoint`: `http://host:port` (or `host:port`: plaintext) or `https://host:port` (TLS).
   * Connects lazily: the first call reaches the node.
   */
  constructor(endpoint: string, options: ClientOptions = {}) {
    const url = endpoint.includes("://") ? endpoint : `http://${endpoint}`;
    const m = /^(https?):\/\/([^/]+)\/?$/.exec(url);
    if (!m) throw invalid("endpoint", `${JSON.stringify(endpoint)} is not http(s)://host:port`);
    const [, scheme, hostPort] = m;
    this.endpoint = url;
    this.options = options;
    this.target = hostPort;
    this.namespace = options.namespace ?? "default";
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retries = options.retries ?? 3;
    if (options.apiKey !== undefined) {
      const key = options.apiKey.trim();
      if (!/^[\x21-\x7e]+$/.test(key)) throw invalid("apiKey", "must be printable ASCII without spaces");
      this.authorization = `Bearer ${key}`;
    }
    const tls = options.tls;
    this.channelOptions = {
      "grpc.max_receive_message_length": DECODE_BYTES_MAX,
      "grpc.max_send_message_length": DECODE_BYTES_MAX,
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 10_000,
      "grpc.keepalive_permit_without_calls": 1,
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 2_000,
    };
    if (scheme === "https") {
      const ca = readPem(tls?.ca, "tls.ca");
      const cert = readPem(tls?.cert, "tls.cert");
      const key = readPem(tls?.key, "tls.key");
      if ((cert === null) !== (key === null)) throw invalid(cert ? "tls.key" : "tls.cert", "a client certificate needs both cert and key");
      this.credentials = grpc.credentials.createSsl(ca, key, cert);
      if (tls?.serverName) this.channelOptions["grpc.ssl_target_name_override"] = tls.serverName;
    } else {
      if (tls && (tls.ca || tls.cert || tls.key)) throw invalid("tls", `TLS options need an https:// endpoint, not ${url}`);
      this.credentials = grpc.credentials.createInsecure();
    }
    const v1 = api().kairos.v1;
    this.executions = new v1.ExecutionService(this.target, this.credentials, this.channelOptions);
    // The other services share the first one's channel.
    const shared = { ...this.channelOptions, channelOverride: this.executions.getChannel() } as grpc.ClientOptions;
    this.workers = new v1.WorkerService(this.target, this.credentials, shared);
    this.definitions = new v1.DefinitionService(this.target, this.credentials, shared);
    this.cron = new v1.CronService(this.target, this.credentials, shared);
    this.admin = new v1.AdminService(this.target, this.credentials, shared);
  }

  /** The same settings (key, TLS, time-out) in another namespace (a new connection). */
  withNamespace(namespace: string): Client {
    return new Client(this.endpoint, { ...this.options, namespace });
  }

  /** Call metadata: the API key. */
  metadata(): grpc.Metadata {
    const md = new grpc.Metadata();
    if (this.authorization) md.set("authorization", this.authorization);
    return md;
  }

  private call<Req, Res>(service: grpc.Client, method: string, req: Req): Promise<Res> {
    const fn = (service as unknown as Record<string, Unary<Req, Res>>)[method];
    return new Promise<Res>((resolve, reject) => {
      fn.call(service, req, this.metadata(), { deadline: Date.now() + this.timeoutMs }, (e, r) => {
        if (e) reject(fromGrpc(e));
        else resolve(r as Res);
      });
    });
  }

  /** Closes the connection (a worker using this client stops working). */
  close(): void {
    this.executions.close();
  }

  // ---- executions ------------------------------------------------------------------------

  /** The request `submit` sends (checked here: the inputs' size, `at` with `afterMs`). */
  submitRequest(definition: string, options: SubmitOptions = {}): SubmitRequest {
    const inputsJson = JSON.stringify(options.inputs ?? {});
    const size = Buffer.byteLength(inputsJson);
    if (size > INPUT_BYTES_MAX) throw invalid("inputs", `is ${size} bytes of JSON, more than ${INPUT_BYTES_MAX}`);
    if (options.at !== undefined && options.afterMs !== undefined) throw invalid("at", "give at or afterMs, not both");
    const req: SubmitRequest = {
      namespace: this.namespace,
      definitionUri: definitionUri(definition),
      definitionVersion: options.version ?? 1,
      inputsJson,
      idempotencyKey: options.idempotencyKey ?? "",
      returnExecution: options.returnExecution ?? false,
      traceparent: options.traceparent ?? "",
    };
    if (options.at !== undefined) req.executeAtMs = options.at instanceof Date ? options.at.getTime() : options.at;
    else {
      const delay = options.afterMs ?? 0;
      if (!(delay >= 0)) throw invalid("afterMs", `must be 0 or more, not ${delay}`);
      req.delayMs = Math.round(delay);
    }
    return req;
  }

  /**
   * Submits one execution of `definition` (a name or `registry://jobs/<name>`), due now
   * unless `at` / `afterMs` says otherwise. A submit whose outcome is unknown (node
   * unreachable, no answer in time) is retried with the same idempotency key, so at most one
   * execution results; without a key the SDK makes one up for the retries.
   */
  async submit(definition: string, options: SubmitOptions = {}): Promise<SubmitResponse__Output> {
    const req = this.submitRequest(definition, options);
    if (!req.idempotencyKey) req.idempotencyKey = `sdk-ts:${randomUUID()}`;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.call<SubmitRequest, SubmitResponse__Output>(this.executions, "Submit", req);
      } catch (e) {
        const err = e as KairosError;
        if (!err.transient || attempt >= this.retries) throw err;
        await sleep(100 * 2 ** attempt);
      }
    }
  }

  /**
   * Submits many (any number: sent 1,000 per SubmitBatch call, one transaction each); each
   * gets its own result, in order: `{ok}` or `{error: {code, message}}`.
   */
  async submitMany(requests: Array<{ definition: string } & SubmitOptions>): Promise<SubmitBatchItem__Output[]> {
    const reqs = requests.map((r, i) => {
      try {
        return this.submitRequest(r.definition, r);
      } catch (e) {
        const err = e as KairosError;
        throw invalid(`requests[${i}].${err.field ?? ""}`.replace(/\.$/, ""), err.details.replace(/^[^:]*: /, ""));
      }
    });
    const out: SubmitBatchItem__Output[] = [];
    for (let i = 0; i < reqs.length; i += SUBMIT_BATCH_MAX) {
      const chunk = reqs.slice(i, i + SUBMIT_BATCH_MAX);
      const r = await this.call<unknown, { items: SubmitBatchItem__Output[] }>(this.executions, "SubmitBatch", { requests: chunk });
      if (r.items.length !== chunk.length) throw new KairosError(grpc.status.INTERNAL, `${r.items.length} results for ${chunk.length} requests`);
      out.push(...r.items);
    }
    return out;
  }

  /** An execution and the first page of its attempts (up to 100). NOT_FOUND if none. */
  get(executionId: string, options: { attemptsCursor?: string } = {}): Promise<ExecutionWithAttempts> {
    return this.call(this.executions, "Get", { namespace: this.namespace, executionId, attemptsCursor: options.attemptsCursor ?? "" });
  }

  /** The execution submitted with this idempotency key, and its attempts. */
  getByIdempotencyKey(idempotencyKey: string): Promise<ExecutionWithAttempts> {
    return this.call(this.executions, "Get", { namespace: this.namespace, idempotencyKey });
  }

  /** Cancels: a pending execution at once (`cancelled` true); a running one by asking its worker to stop. */
  cancel(executionId: string): Promise<CancelResponse__Output> {
    return this.call(this.executions, "Cancel", { namespace: this.namespace, executionId });
  }

  /** Runs a FAILED execution again, as its next attempt. */
  async replay(executionId: string): Promise<Execution__Output> {
    const r = await this.call<unknown, { execution: Execution__Output }>(this.executions, "Replay", { namespace: this.namespace, executionId });
    return r.execution;
  }

  /** One page of executions; pass `nextCursor` back as `cursor` (empty: the end). */
  list(options: ListOptions = {}): Promise<ExecutionPage> {
    const limit = options.limit ?? 100;
    if (limit < 1 || limit > LIST_PAGE_MAX) throw invalid("limit", `must be 1..${LIST_PAGE_MAX}, not ${limit}`);
    return this.call(this.executions, "List", {
      namespace: this.namespace,
      status: options.status ?? "EXECUTION_STATUS_UNSPECIFIED",
      definition: options.definition ? definitionUri(options.definition) : "",
      fromMs: options.fromMs ?? 0,
      toMs: options.toMs ?? 0,
      limit,
      cursor: options.cursor ?? Buffer.alloc(0),
    });
  }

  /** Every execution matching, page after page. */
  async *listAll(options: Omit<ListOptions, "cursor"> = {}): AsyncGenerator<Execution__Output> {
    let cursor: Buffer | undefined;
    do {
      const page = await this.list({ ...options, cursor });
      yield* page.executions;
      cursor = page.nextCursor.length ? page.nextCursor : undefined;
    } while (cursor);
  }

  /** Waits until the execution is SUCCEEDED, FAILED or CANCELLED (polling, back-off up to 1 s); DEADLINE_EXCEEDED after `timeoutMs`. */
  async wait(executionId: string, timeoutMs = 60_000): Promise<Execution__Output> {
    const deadline = Date.now() + timeoutMs;
    let pause = 20;
    for (;;) {
      const { execution } = await this.get(executionId);
      if (TERMINAL.has(execution.status)) return execution;
      if (Date.now() + pause > deadline) {
        throw new KairosError(grpc.status.DEADLINE_EXCEEDED, `execution ${executionId} still ${execution.status} after ${timeoutMs} ms`);
      }
      await sleep(pause);
      pause = Math.min(pause * 2, 1_000);
    }
  }

  // ---- definitions -----------------------------------------------------------------------

  /** Registers a definition file's text (YAML or JSON); versions are immutable. */
  applyDefinition(source: string): Promise<{ definition: Definition__Output; created: boolean }> {
    return this.call(this.definitions, "Register", { namespace: this.namespace, source });
  }

  /** A definition version (default: the latest). */
  async getDefinition(name: string, version = 0): Promise<Definition__Output> {
    const r = await this.call<unknown, { definition: Definition__Output }>(this.definitions, "Get", { namespace: this.namespace, name, version });
    return r.definition;
  }

  /** Every definition version of the namespace. */
  async listDefinitions(): Promise<Definition__Output[]> {
    const r = await this.call<unknown, { definitions: Definition__Output[] }>(this.definitions, "List", { namespace: this.namespace });
    return r.definitions;
  }

  // ---- cron ------------------------------------------------------------------------------

  /** Creates a cron job (`expression`: 5 fields, 6 with seconds first, or @daily…; `timezone` IANA). */
  createCron(job: Omit<CreateCronJobRequest, "namespace" | "definitionUri"> & { definition: string }): Promise<CronJobResponse__Output> {
    const { definition, ...rest } = job;
    return this.call(this.cron, "Create", { definitionVersion: 1, ...rest, namespace: this.namespace, definitionUri: definitionUri(definition) });
  }

  /** Changes the given fields only. */
  async updateCron(cronJobId: string, changes: Omit<UpdateCronJobRequest, "namespace" | "cronJobId">): Promise<CronJob__Output> {
    const r = await this.call<unknown, CronJobResponse__Output>(this.cron, "Update", { ...changes, namespace: this.namespace, cronJobId });
    return r.cronJob!;
  }

  async pauseCron(cronJobId: string): Promise<CronJob__Output> {
    return (await this.call<unknown, CronJobResponse__Output>(this.cron, "Pause", { namespace: this.namespace, cronJobId })).cronJob!;
  }

  /** `catchUp`: the occurrences missed while paused run under the job's missed-run policy. */
  async resumeCron(cronJobId: string, catchUp = false): Promise<CronJob__Output> {
    return (await this.call<unknown, CronJobResponse__Output>(this.cron, "Resume", { namespace: this.namespace, cronJobId, catchUp })).cronJob!;
  }

  async deleteCron(cronJobId: string): Promise<void> {
    await this.call(this.cron, "Delete", { namespace: this.namespace, cronJobId });
  }

  async getCron(cronJobId: string): Promise<CronJob__Output> {
    return (await this.call<unknown, CronJobResponse__Output>(this.cron, "Get", { namespace: this.namespace, cronJobId })).cronJob!;
  }

  listCron(options: { limit?: number; cursor?: string } = {}): Promise<ListCronJobsResponse__Output> {
    return this.call(this.cron, "List", { namespace: this.namespace, limit: options.limit ?? 100, cursor: options.cursor ?? "" });
  }

  /** The occurrences of an expression in [fromMs, untilMs) (no stored job needed). */
  async previewCron(options: { expression: string; timezone?: string; fromMs: number; untilMs: number; limit?: number; dstGap?: string; dstFold?: string }): Promise<Occurrence__Output[]> {
    const r = await this.call<unknown, { occurrences: Occurrence__Output[] }>(this.cron, "Preview", { timezone: "UTC", ...options });
    return r.occurrences;
  }

  /** Materializes the job's occurrences of a past range (at most 1,000). */
  backfillCron(cronJobId: string, options: { fromMs: number; untilMs: number; overlap?: string }): Promise<BackfillResponse__Output> {
    return this.call(this.cron, "Backfill", { ...options, namespace: this.namespace, cronJobId });
  }

  /** Runs an ACTIVE job now, outside its schedule. */
  triggerCron(cronJobId: string, overlap = ""): Promise<TriggerResponse__Output> {
    return this.call(this.cron, "Trigger", { namespace: this.namespace, cronJobId, overlap });
  }

  /** The executions of a job's occurrences, oldest first. */
  cronRuns(cronJobId: string, options: { limit?: number; cursor?: Buffer } = {}): Promise<ExecutionPage> {
    return this.call(this.cron, "Runs", { namespace: this.namespace, cronJobId, limit: options.limit ?? 100, cursor: options.cursor ?? Buffer.alloc(0) });
  }

  // ---- access ----------------------------------------------------------------------------

  /** Creates an API key (`scopes`: submit, read, worker, definitions, admin) for a namespace or `*`; the token is in this reply only. */
  createApiKey(options: { namespace?: string; scopes: string[]; name: string }): Promise<CreateApiKeyResponse__Output> {
    return this.call(this.admin, "CreateApiKey", { namespace: options.namespace ?? this.namespace, scopes: options.scopes, name: options.name });
  }

  async listApiKeys(namespace = ""): Promise<ApiKey__Output[]> {
    return (await this.call<unknown, { keys: ApiKey__Output[] }>(this.admin, "ListApiKeys", { namespace })).keys;
  }

  async revokeApiKey(id: string): Promise<ApiKey__Output> {
    return (await this.call<unknown, { key: ApiKey__Output }>(this.admin, "RevokeApiKey", { id })).key;
  }

  whoAmI(): Promise<WhoAmIResponse__Output> {
    return this.call(this.admin, "WhoAmI", {});
  }

  async auditLog(options: { fromMs?: number; limit?: number } = {}): Promise<AuditEntry__Output[]> {
    return (await this.call<unknown, { entries: AuditEntry__Output[] }>(this.admin, "AuditLog", { namespace: this.namespace, ...options })).entries;
  }

  /** Executions by status, of this namespace (`all`: of every namespace, which needs a `*` key). */
  async stats(all = false): Promise<Record<string, number>> {
    const r = await this.call<unknown, { executions: Array<{ status: string; count: string }> }>(this.admin, "Stats", { namespace: all ? "" : this.namespace });
    return Object.fromEntries(r.executions.map((c) => [c.status, Number(c.count)]));
  }

  limits(): Promise<LimitsResponse__Output> {
    return this.call(this.admin, "Limits", { namespace: this.namespace });
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

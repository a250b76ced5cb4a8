// Types of gen-durable (lib/index.js), checked by test/types (tsc --noEmit in `make check`).
import type { Client as PgClient, ClientConfig, Pool, PoolConfig } from 'pg';

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type State = { [key: string]: Json };
/** Seconds. */
export type Seconds = number;

/** What a step returns: build it with the functions below. */
export interface Outcome {
  readonly kind: 'next' | 'retry' | 'wait_signal' | 'spawn' | 'done' | 'stop';
}

export function nextStep(step: string, state?: State | null, delay?: Seconds): Outcome;
export function retry(error?: Json, backoff?: Seconds): Outcome;
export function waitSignal(names: Iterable<string>,
  options?: { timeout?: Seconds; thenStep?: string; state?: State }): Outcome;
export function spawn(children: Iterable<InsertEntry & { fsm: string }>, thenStep: string, state?: State): Outcome;
export function done(result?: Json): Outcome;
export function stop(error?: Json): Outcome;

export interface InsertOptions {
  state?: State;
  step?: string;
  queue?: string;
  priority?: number;
  concurrencyKey?: string;
  correlationKey?: string;
  correlationScope?: string[];
  rateLimit?: string;
  weight?: number;
  eligibleAt?: Date | string;
  scheduleIn?: Seconds;
  onDuplicate?: 'error' | 'existing' | 'skip';
  traceContext?: string;
  /** Join the key's pending debounced instance (its state replaced), to run this long after the last insert. */
  debounce?: Seconds;
  /** At most one instance of the key per period; the others dropped (null) or queued, as onThrottle says. */
  throttle?: Seconds;
  onThrottle?: 'drop' | 'queue';
  /** Its share of its owner's part of a queue: instances of one key are picked beside those of others. */
  fairnessKey?: string;
}
/** An entry of insertAll, or a child of spawn: insert's options but onDuplicate. */
export type InsertEntry = Omit<InsertOptions, 'onDuplicate'>;

export type Status = 'runnable' | 'executing' | 'awaiting_signal' | 'awaiting_children' | 'done' | 'failed'
  | 'cancelled';

export interface Settled {
  status: Status | 'busy';
  step: string;
  attempt: number;
  result: Json;
  error: Json;
}

export interface Instance {
  id: number; fsm: string; version: number; step: string; status: Status; state: State; attempt: number;
  result: Json; error: Json; correlationKey: string | null; queue: string; parentId: number | null;
  createdAt: Date; updatedAt: Date; finishedAt: Date | null;
}

export class Client {
  constructor(client: PgClient | Pool, options?: { own?: boolean; apiSchema?: string | null });
  static connect(config?: string | ClientConfig,
    options?: { pooler?: boolean; apiSchema?: string | null }): Promise<Client>;
  /** Over a pool of `max` connections (10), for an HTTP server: each call on whichever is free. */
  static pool(config?: string | PoolConfig, options?: { max?: number; apiSchema?: string | null }): Client;
  readonly client: PgClient | Pool;
  end(): Promise<void>;
  insert(fsm: string, state?: State, options?: Omit<InsertOptions, 'state'>): Promise<number | null>;
  insertAll(fsm: string, entries: Iterable<InsertEntry>): Promise<number[]>;
  signal(target: number | string, name: string, payload?: Json,
    options?: { dedupKey?: string | null; missingOk?: boolean; expires?: Seconds | null }): Promise<boolean | null>;
  wait(id: number, options?: { timeout?: Seconds; until?: 'settled' | 'terminal' }): Promise<Settled>;
  cancel(id: number, reason?: string | null): Promise<boolean>;
  retry(id: number): Promise<boolean>;
  /** gd_rewind: false when the instance is done, cancelled or not yours; the FSM owner's rights (else 42501). */
  rewind(id: number, step: string, options?: { state?: State | null }): Promise<boolean>;
  /** gd_fork: a new instance from entry `entry` of the instance's step history (its number in gd_history). */
  fork(id: number, entry: number, options?: { state?: State | null }): Promise<number>;
  /** gd_migrate: how many live instances moved; stepMap: { [oldStep]: newStep }. */
  migrate(fsm: string, fromVersion: number, toVersion: number, stepMap?: { [step: string]: string }): Promise<number>;
  get(id: number): Promise<Instance | null>;
  drain(queue: string, options?: { withScheduled?: boolean; maxSteps?: number }): Promise<number>;
}

/** ctx.cancelled: the gd_cancel that sent the instance into its compensation, and where it found it. */
export interface Cancellation {
  kind: "cancelled";
  message: string;
  reason: string;
  step: string;
  attempt: number;
  status: Status;
  at: string;
}

/** What a handler is told (gd.context), and the connection whose transaction commits its outcome. */
export interface Context {
  id: number;
  fsm: string;
  version: number;
  step: string;
  attempt: number;
  correlationKey: string | null;
  signals: { name: string; payload: Json; dedup_key: string | null; delivered_at: string }[];
  children: { id: number; fsm: string; status: Status; result: Json; error: Json }[];
  timedOut: boolean;
  queue: string;
  traceContext: string | null;
  /** The same on every attempt of this visit of the step: key external effects by it. */
  idempotencyKey: string;
  /** When the step's timeout ends this attempt; null without a timeout. */
  deadline: Date | null;
  /** Set while the instance runs its FSM's on_cancel step: why a gd_cancel sent it there, and where it was. */
  cancelled: Cancellation | null;
  /** Aborted when the step ends without the handler (its deadline, or the drain's limit). */
  signal: AbortSignal;
  /** The lane's client: the handler's first query begins the step's transaction, which commits with its outcome. */
  connection: PgClient;
}

export type Handler = (state: State, ctx: Context) => Outcome | Promise<Outcome>;
/** A batch step's handler: the states and contexts of the claims of its step that one claim brought, in order;
 *  one outcome per claim, in that order (the contexts share one connection and one signal). */
export type BatchHandler = (states: State[], ctxs: Context[]) => Outcome[] | Promise<Outcome[]>;

export interface WorkerOptions {
  handlers?: { [fsmSlashStep: string]: Handler };
  queues?: string[] | null;
  concurrency?: number;
  batch?: number;
  lease?: Seconds;
  wait?: Seconds;
  drainTimeout?: Seconds;
  name?: string | null;
  pooler?: boolean | null;
  apiSchema?: string | null;
  log?: { info(message: string): void; warn(message: string): void };
  /** An OpenTelemetry Tracer (@opentelemetry/api's) for the steps' spans; default: the global provider's. */
  tracer?: OpenTelemetryTracer | null;
}

/** The part of @opentelemetry/api's Tracer the worker uses (that package is an optional peer dependency). */
export interface OpenTelemetryTracer {
  startSpan(name: string, options?: object, context?: unknown): unknown;
}

export class Worker {
  constructor(config?: string | ClientConfig, options?: WorkerOptions);
  step(fsm: string, step: string, handler: Handler, options?: { batch?: false }): this;
  /** A batch step's handler: called once for the claims of its step that one claim brought. */
  step(fsm: string, step: string, handler: BatchHandler, options: { batch: true }): this;
  run(options?: { signals?: boolean }): Promise<void>;
  stop(): void;
}

/** The part of an OpenTelemetry SpanExporter (OTLPTraceExporter, InMemorySpanExporter, ...) the exporter uses. */
export interface OpenTelemetrySpanExporter {
  export(spans: unknown[], resultCallback: (result: { code: number; error?: Error }) => void): void;
  shutdown(): Promise<void>;
}

export interface StepSpanExporterOptions {
  spanExporter: OpenTelemetrySpanExporter;
  /** Its checkpoint's name (default 'default'): one exporter of a name runs at a time. */
  name?: string;
  /** Where a new checkpoint starts (default: now). */
  since?: Date;
  pageSize?: number;
  interval?: Seconds;
  /** Where the checkpoints are kept (default 'gd_trace_checkpoints'; may be schema-qualified). */
  checkpointTable?: string;
  /** The spans' OpenTelemetry Resource (the service's name). */
  resource?: unknown;
  log?: { info(message: string): void; warn(message: string): void };
}

/** The spans of in-database steps, from gd.step_history (needs @opentelemetry/api and @opentelemetry/sdk-trace-base). */
export class StepSpanExporter {
  constructor(config: string | ClientConfig, options: StepSpanExporterOptions);
  /** Send the spans of the steps that ended since the last call (a page at most); how many. */
  exportOnce(): Promise<number>;
  /** Export every `interval` seconds until stop(), then close(). */
  run(): Promise<void>;
  stop(): void;
  /** End its connection and shut the span exporter down. */
  close(): Promise<void>;
}

export function connect(config?: string | ClientConfig,
  options?: { pooler?: boolean; applicationName?: string }): Promise<{ client: PgClient; pooler: boolean }>;
export function behindPooler(reachedPort: string | number | null, serverPort: string | number): boolean;

/** A test's transaction (testTransaction): rolled back when the test's body ends. */
export interface TestTransaction {
  /** The transaction's connection. */
  connection: PgClient;
  /** The API, in the transaction. */
  client: Client;
  /** The test's clock: the transaction's start, until advance() or setClock() moves it. */
  now: Date;
  /** gd_drain: the queue's in-database steps due by the test's clock, and the waits and joins due. */
  drain(queue: string, options?: { withScheduled?: boolean; maxSteps?: number }): Promise<number>;
  advance(by: { days?: number; hours?: number; minutes?: number; seconds?: number }): Promise<Date>;
  setClock(now: Date): Promise<Date>;
  /** Claim the queue's external steps due, run their handlers in the transaction, complete them; how many ran. */
  runExternal(queue: string, handlers: { [fsmSlashStep: string]: Handler } | Worker,
              options?: { batch?: number }): Promise<number>;
}

/** Run `body` in a transaction on a connection of its own, rolled back when it ends; resolves to its result. */
export function testTransaction<T>(config: string | ClientConfig, body: (t: TestTransaction) => Promise<T>,
                                   options?: { apiSchema?: string | null }): Promise<T>;

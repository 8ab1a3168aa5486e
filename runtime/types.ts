// The runtime's public surface: what tools/ and server/ may use. The wire format behind it is
// described in runtime/PROTOCOL.md; each op's args and result are typed in wire/ops.ts. Nothing
// here imports from tools/, server/ or policies/.
import type { OpArgs, OpName, OpResult } from "./wire/ops.js";

export { TENSOR_DTYPES, type TensorDtype } from "../lib/dtypes.js";
import type { TensorDtype } from "../lib/dtypes.js";
import type { DeviceKind } from "../lib/device.js";

export const MODEL_DTYPES = ["float32", "bfloat16", "float16"] as const;
export type ModelDtype = (typeof MODEL_DTYPES)[number];

export type ExecutionMode = "eager" | "compile";

/** A tensor crossing the pipe: raw little-endian, C-contiguous bytes. */
export interface TensorData {
  dtype: TensorDtype;
  shape: number[];
  data: Buffer;
}

export interface DeviceInfo {
  kind: DeviceKind;
  name: string;
  index: number;
  count: number;
  memory_total_bytes: number | null;
  memory_free_bytes: number | null;
  backend: string;
  backend_version: string | null;
}

export interface ProbeStep {
  backend: string;
  matched: boolean;
  reason: string;
}

export interface WorkerHello {
  protocol: number;
  worker_version: string;
  torch_version: string;
  python_version: string;
  pid: number;
  device: DeviceInfo;
  devices: DeviceInfo[];
  probe: ProbeStep[];
  backend_version: string | null;
}

export type WorkerState = "stopped" | "starting" | "ready" | "restarting" | "failed";

export interface ProgressUpdate {
  progress: number;
  total?: number;
  message?: string;
}

/** Attribute values a span takes (OpenTelemetry's, without importing it into the runtime). */
export type SpanAttributes = Record<string, string | number | boolean | undefined>;

/**
 * A span of a call's trace (tools/support/trace.ts). Times are CLOCK_MONOTONIC µs, the clock the
 * worker stamps with; omitted = now.
 */
export interface TraceSpan {
  child(name: string, attrs?: SpanAttributes, startUs?: number): TraceSpan;
  set(attrs: SpanAttributes): void;
  /** Ends the span, as failed with `errorType` (a stable error code) when one is given. */
  end(errorType?: string, endUs?: number): void;
  /** The W3C traceparent naming this span, for the worker's frame header. */
  traceparent(): string | undefined;
  /** Its trace and span ids (hex), when the span is real (spans are exported or propagated). */
  ids(): { trace_id: string; span_id: string } | undefined;
}

/**
 * A traced call: its request span, plus the stage stamps the bench's decomposition reads.
 * `atUs` is CLOCK_MONOTONIC in µs, the clock the worker stamps with; omitted = now.
 */
export interface CallTrace extends TraceSpan {
  mark(stage: string, atUs?: number): void;
}

export interface CallOptions {
  tensors?: TensorData[];
  /** Stamps the client side of the call and asks the worker for its own stamps. */
  trace?: CallTrace;
  signal?: AbortSignal;
  /** Per-call timeout; on expiry a cancel is sent, then the worker is killed if it stays silent. */
  timeoutMs?: number;
  onProgress?: (p: ProgressUpdate) => void;
  /** The ticket from Runtime.place: the call runs where it says, and notes where it ran. */
  placement?: Placement;
}

export interface CallResult<T = Record<string, unknown>> {
  result: T;
  tensors: TensorData[];
  /** The worker that answered (set by the pool). */
  worker?: string;
}

/** Events a supervisor emits; the server turns them into logs and metrics. */
export interface RuntimeEvents {
  ready: (hello: WorkerHello) => void;
  /** `error` is set when the process could not be started at all (ENOENT, EACCES). */
  exit: (info: {
    code: number | null;
    signal: string | null;
    inFlight: number;
    error?: string;
  }) => void;
  restart: (info: { attempt: number; delayMs: number; lostModels: string[] }) => void;
  failed: (info: { reason: string }) => void;
  log: (line: { level: string; msg: string; [k: string]: unknown }) => void;
}

/** A model a worker holds, as observed from successful load/unload results. */
export interface LoadedModel {
  model: string;
  device?: string;
  dtype?: string;
  mode?: string;
  loadedAt: number;
}

/**
 * Where one tool call runs, decided once (runtime/pool/placement.ts) before the gate queues it:
 * the gate serialises on `lane`, and the call is handed the same ticket, so the worker the gate
 * waited for is the worker that runs it. The ticket is also the call's receipt: the pool notes on
 * it every worker the call's runtime calls ran on, for the audit record.
 */
export interface Placement {
  readonly op: string;
  /** The gate's device lane; undefined when the pool routes per call (infer, several replicas). */
  readonly lane: string | undefined;
  /** The worker chosen now; undefined when the call is routed when it is sent. */
  readonly worker: string | undefined;
  /** Workers this call's runtime calls were sent to, in order, each once. */
  ran(): string[];
}

/**
 * The compute side: always a pool (runtime/pool/pool.ts), possibly of one local worker (the
 * default, `single`). `call` rejects with RuntimeCallError; its result names the worker that
 * answered.
 */
export interface Runtime {
  readonly state: WorkerState;
  readonly hello: WorkerHello | null;
  /**
   * One local worker and nothing to place (the default): the pool passes calls and answers
   * through unchanged, as the one worker did before there were pools.
   */
  readonly single: boolean;
  start(): Promise<WorkerHello>;
  /** Starts the workers if needed and waits until one is ready. */
  ready(): Promise<WorkerHello>;
  /** Chooses where a call of `op` with these args will run (once; pass it in CallOptions). */
  place(op: string, args: Record<string, unknown>): Placement;
  /** One worker op, typed by the op table (wire/ops.ts). */
  call<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    opts?: CallOptions,
  ): Promise<CallResult<OpResult<O>>>;
  /** Models lost in the last worker restart, cleared when they are loaded again. */
  lostModels(): string[];
  /** Models held now, on every worker. */
  loadedModels(): LoadedModel[];
  restarts(): number;
  inFlight(): number;
  /** Every worker's state, placement and counters. */
  workers(): WorkerStatus[];
  /** A drained worker takes no new calls or loads (`tpu-mcp workers drain NAME`). */
  drain(name: string): WorkerStatus;
  undrain(name: string): WorkerStatus;
  on<E extends keyof RuntimeEvents>(event: E, fn: RuntimeEvents[E]): void;
  close(): Promise<void>;
}

/** One worker of a pool, as get_runtime_status and /metrics show it. */
export interface WorkerStatus {
  name: string;
  device: string;
  kind: "local" | "remote";
  address: string | null;
  state: WorkerState;
  draining: boolean;
  restarts: number;
  pid: number | null;
  in_flight: number;
  calls: number;
  failures: number;
  memory_total_bytes: number | null;
  memory_free_bytes: number | null;
  models: string[];
  lost_models: string[];
  /** Why it is not serving: its last unexpected exit, refusal or failure (null when ready). */
  last_error: string | null;
  /** The device the worker's own hello reported (null before its first hello). */
  chip: { kind: string; index: number; name: string; backend: string } | null;
  /**
   * A remote worker shared by several control planes (`tpu_worker serve`), from its last status:
   * the control planes it serves and the requests of all of them in it (`in_flight` above counts
   * this one's own).
   */
  shared?: { control_planes: number; max_control_planes: number; in_flight: number };
}

/** Error codes the runtime produces itself (the worker's own codes pass through unchanged). */
export const RUNTIME_ERROR_CODES = [
  "worker_died",
  "worker_unavailable",
  "runtime_setting_up",
  "timeout",
  "cancelled",
  "protocol_error",
] as const;

export class RuntimeCallError extends Error {
  readonly code: string;
  readonly recoverable: boolean;
  readonly details?: Record<string, unknown>;
  constructor(
    code: string,
    message: string,
    recoverable: boolean,
    details?: Record<string, unknown>,
  ) {
    super(message);
    this.name = "RuntimeCallError";
    this.code = code;
    this.recoverable = recoverable;
    this.details = details;
  }
}

/** A Ray fleet as get_runtime_status and /metrics show it (runtime/fleet/ray.ts fills it). */
export interface FleetState {
  /** The driver: starting, ready, refused, restarting, stopped. */
  state: string;
  address: string;
  mode: string;
  ray_version: string | null;
  /** Slots the cluster offers for this placement (null: no limit known). */
  capacity: number | null;
  /** Actors wanted (config count, `workers scale`, a reload). */
  target: number | null;
  /** Actors placed and serving (state "up"). */
  observed: number;
  /** Times the driver process was restarted by the control plane. */
  driver_restarts: number;
  /** Ray's restarts of actors, summed over the actors placed now. */
  actor_restarts: number;
  error: { code: string; message: string } | null;
  /**
   * On a shared store (storage.postgres): the replica that runs the fleet driver (null: none holds
   * its lease now). Every replica serves the same actors. Absent: this replica's own driver.
   */
  leader?: string | null;
  actors: Array<{
    name: string;
    state: string;
    restarts: number;
    address: string | null;
    device: string | null;
    node: string | null;
  }>;
}

/**
 * Why the gate stopped a call (its budget ran out, or its time limit), as its abort signal's
 * reason carries it (`{ stop: "budget" }`): the worker is told, and ends the call with what it
 * has (a benchmark's measured part marked `stopped`) instead of discarding it.
 */
export type StopReason = "budget" | "timeout" | "approval";

export function stopReasonOf(reason: unknown): StopReason | undefined {
  const stop = (reason as { stop?: unknown } | null | undefined)?.stop;
  return stop === "budget" || stop === "timeout" || stop === "approval" ? stop : undefined;
}

/**
 * A cancel whose caller keeps the finished part (cancel_job on a running job): its abort reason
 * carries `keepPartial: true`, so the runtime waits for the worker's own answer as it does after
 * a stop, rather than giving up after its cancel grace: a loaded host can take longer than that
 * to reach the next step boundary, and the job would lose what it had measured.
 */
export function keepPartialCancel(message: string): Error {
  return Object.assign(new Error(message), { keepPartial: true as const });
}

export function keepsPartial(reason: unknown): boolean {
  return (reason as { keepPartial?: unknown } | null | undefined)?.keepPartial === true;
}

/** A result that ends early with its finished part: cancelled, or stopped by the gate. */
export function isPartialResult(result: unknown): boolean {
  const r = result as { cancelled?: unknown; stopped?: unknown } | null | undefined;
  return r?.cancelled === true || stopReasonOf({ stop: r?.stopped }) !== undefined;
}

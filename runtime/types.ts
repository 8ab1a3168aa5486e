// The runtime's public surface: what tools/ and server/ may use. The wire format behind it is
// described in runtime/PROTOCOL.md. Nothing here imports from tools/, server/ or policies/.

export const TENSOR_DTYPES = [
  "float32",
  "float16",
  "bfloat16",
  "float64",
  "int64",
  "int32",
  "int16",
  "int8",
  "uint8",
  "bool",
] as const;
export type TensorDtype = (typeof TENSOR_DTYPES)[number];

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
  kind: "tpu" | "xla" | "cuda" | "cpu";
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

/**
 * Per-call timestamps for the bench's decomposition (`trace_calls` in the server config; off by
 * default). `atUs` is CLOCK_MONOTONIC in µs, the clock the worker stamps with; omitted = now.
 */
export interface CallTrace {
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
}

export interface CallResult<T = Record<string, unknown>> {
  result: T;
  tensors: TensorData[];
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

/**
 * One interface for the compute side, so several workers (one per device) can sit behind it.
 * `call` rejects with RuntimeCallError.
 */
export interface Runtime {
  readonly state: WorkerState;
  readonly hello: WorkerHello | null;
  start(): Promise<WorkerHello>;
  /** Starts the worker if needed and waits until it is ready. */
  ready(): Promise<WorkerHello>;
  call<T = Record<string, unknown>>(
    op: string,
    args: Record<string, unknown>,
    opts?: CallOptions,
  ): Promise<CallResult<T>>;
  /** Models lost in the last worker restart, cleared when they are loaded again. */
  lostModels(): string[];
  restarts(): number;
  inFlight(): number;
  on<E extends keyof RuntimeEvents>(event: E, fn: RuntimeEvents[E]): void;
  close(): Promise<void>;
  /** Pools only: the worker a call will hold (its device lane in the gate), when its args tell. */
  laneOf?(op: string, args: Record<string, unknown>): string | undefined;
  /** Pools only: every worker's state, placement and counters. */
  workers?(): WorkerStatus[];
  /** Pools with a Ray fleet (runtime.ray) only: the fleet's driver and actors. */
  fleet?(): FleetState;
  /** Pools only: runs fn, appending to `sink` the name of every worker its calls are sent to. */
  withPlacement?<T>(sink: string[], fn: () => Promise<T>): Promise<T>;
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
  /** The device the worker's own hello reported (null before its first hello). */
  chip: { kind: string; index: number; name: string; backend: string } | null;
}

/** Error codes the runtime produces itself (the worker's own codes pass through unchanged). */
export const RUNTIME_ERROR_CODES = [
  "worker_died",
  "worker_unavailable",
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
  actors: Array<{
    name: string;
    state: string;
    restarts: number;
    address: string | null;
    device: string | null;
    node: string | null;
  }>;
}

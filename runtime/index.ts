// The runtime package's entry point: what server/ and tools/ import.
export * from "./types.js";
export { WorkerRuntime, createRuntime, resolveRuntimeOptions } from "./client.js";
export type {
  LoadedModel,
  RuntimeLogger,
  SpawnFn,
  WorkerRuntimeEvents,
  WorkerRuntimeOptions,
} from "./client.js";
export {
  DTYPE_ITEMSIZE,
  DEFAULT_MAX_BODY_BYTES,
  MAX_HEADER_BYTES,
  FrameDecoder,
  FrameError,
  encodeFrame,
  decodeFrame,
  tensorFrom,
  tensorView,
  tensorNbytes,
} from "./framing.js";
export type { Frame, TensorDescriptor } from "./framing.js";
export { PROTOCOL_VERSION } from "./messages.js";

// A benchmark request's defaults, in one place: run_benchmark fills them into the request
// (tools/run_benchmark.ts: the worker receives it fully resolved) and the estimator prices work
// that does not name them with the same values (policies/estimate.ts), so what is estimated is
// what runs. In lib/, the dependency-free leaf both tools/ and policies/ may import.

/** The shortest sequence a text model is benchmarked at (a special token plus one of text). */
export const MIN_SEQ_LEN = 2;
/** Iterations per configuration when neither iterations nor duration_s is given. */
export const DEFAULT_ITERATIONS = 20;
/** Sequence length of a text model when none is given (capped by the model's limit). */
export const DEFAULT_SEQ_LEN = 128;
/** New tokens per prompt for work "generate" (capped by the model's limit). */
export const DEFAULT_MAX_NEW_TOKENS = 16;
/** Uncounted calls before the measured window of each configuration. */
export const DEFAULT_WARMUP = 3;
/** An unstable configuration runs up to this many times its requested window (within the bounds). */
export const EXTEND_FACTOR = 4;

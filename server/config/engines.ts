// `runtime.engines`: engines that serve catalog entries beside the worker's own PyTorch (today
// vLLM, for entries with "engine": "vllm"; docs/vllm.md). The worker gets the resolved settings as
// `--engine-vllm JSON` (tpu_worker/engines/settings.py) and starts, supervises and stops the engine.
import { isAbsolute, resolve } from "node:path";
import { z } from "zod";

export const VllmEngineSchema = z
  .object({
    /** The Python of vLLM's own environment (scripts/setup-vllm.sh makes .venv-vllm). */
    python: z.string().min(1).default(".venv-vllm/bin/python"),
    /** Extra arguments for vLLM's API server (e.g. ["--max-num-seqs", "64"]). */
    args: z.array(z.string().min(1).max(256)).max(64).default([]),
    /** An operator-run vLLM server instead of one the worker starts: its base URL. */
    url: z
      .string()
      .regex(/^https?:\/\/[^/\s]+$/, "a base URL without a path, e.g. http://127.0.0.1:8000")
      .optional(),
    /** The file holding that server's API key (required with url). */
    key_file: z.string().min(1).optional(),
    /** How long a started server may take to answer /health (the first start compiles). */
    start_timeout_s: z.number().positive().max(3600).default(300),
    /** Crashes restarted within restart_window_s before the engine is left failed. */
    max_restarts: z.number().int().min(0).max(100).default(5),
    restart_window_s: z.number().positive().max(86_400).default(300),
    /** vLLM's KV cache on a CPU host (VLLM_CPU_KVCACHE_SPACE, GiB; vLLM's own default is 4). */
    kv_cache_gib: z.number().positive().max(4096).default(1),
  })
  .strict()
  .refine((v) => !v.url || v.key_file, {
    message: "an operator-run endpoint (url) needs key_file: the file holding its API key",
    path: ["key_file"],
  });

export const EnginesSchema = z.object({ vllm: VllmEngineSchema.optional() }).strict().prefault({});

export type VllmEngineConfig = z.infer<typeof VllmEngineSchema>;

/** python and key_file against the config file's folder (the default python: the repo root). */
export function resolveVllmPaths(
  v: VllmEngineConfig,
  base: string,
  /** The install layout's vLLM interpreter, used when the file names none. */
  defaultPython: string,
  pythonGiven: boolean,
): VllmEngineConfig {
  const abs = (p: string, from: string) => (isAbsolute(p) ? p : resolve(from, p));
  return {
    ...v,
    python: pythonGiven ? abs(v.python, base) : defaultPython,
    key_file: v.key_file && abs(v.key_file, base),
  };
}

/** The worker's command-line arguments for the engines, empty when none is configured. */
export function engineArgs(engines: { vllm?: VllmEngineConfig } | undefined): string[] {
  return engines?.vllm ? ["--engine-vllm", JSON.stringify(engines.vllm)] : [];
}

// runtime.engines.vllm: what the server accepts, how its paths resolve, and what the worker is
// told (`--engine-vllm JSON`, only when configured, so a default worker's command is unchanged).
import { describe, expect, it } from "vitest";
import { parseConfig } from "../../server/config/config.js";
import { engineArgs } from "../../server/config/engines.js";
import { baseRuntimeOptions } from "../../server/app/build_runtime.js";
import { parseCatalog } from "../../runtime/catalog.js";
import pino from "pino";

const root = "/repo";
const base = "/etc/tpu-mcp";

describe("runtime.engines.vllm", () => {
  it("is absent by default and then adds nothing to the worker's command", () => {
    const c = parseConfig({}, { root });
    expect(c.runtime.engines.vllm).toBeUndefined();
    expect(engineArgs(c.runtime.engines)).toEqual([]);
    expect(baseRuntimeOptions(c, pino({ level: "silent" })).extraArgs).toEqual([
      "--threads",
      expect.any(String),
      "--compile-cache",
      `${c.paths.data_dir}/compile-cache`,
      "--kept-dir",
      `${c.paths.data_dir}/kept`,
    ]);
  });

  it("resolves a given python and key file against the config's folder, the default against the repo", () => {
    const given = parseConfig(
      { runtime: { engines: { vllm: { python: "envs/vllm/bin/python", args: ["--x", "1"] } } } },
      { root, base },
    );
    expect(given.runtime.engines.vllm!.python).toBe("/etc/tpu-mcp/envs/vllm/bin/python");
    const dflt = parseConfig({ runtime: { engines: { vllm: {} } } }, { root, base });
    expect(dflt.runtime.engines.vllm!.python).toBe("/repo/.venv-vllm/bin/python");
    const args = baseRuntimeOptions(given, pino({ level: "silent" })).extraArgs!;
    const json = JSON.parse(args[args.indexOf("--engine-vllm") + 1]);
    expect(json).toMatchObject({
      python: "/etc/tpu-mcp/envs/vllm/bin/python",
      args: ["--x", "1"],
      start_timeout_s: 300,
    });
    const remote = parseConfig(
      { runtime: { engines: { vllm: { url: "http://127.0.0.1:8000", key_file: "k" } } } },
      { root, base },
    );
    expect(remote.runtime.engines.vllm!.key_file).toBe("/etc/tpu-mcp/k");
  });

  it("refuses an endpoint without its key file, a URL with a path, and unknown keys", () => {
    for (const vllm of [
      { url: "http://127.0.0.1:8000" },
      { url: "http://127.0.0.1:8000/v1", key_file: "k" },
      { pyhton: "x" },
    ])
      expect(() => parseConfig({ runtime: { engines: { vllm } } }, { root })).toThrow(/engines/);
  });

  it("the catalog takes engine torch (the default) or vllm, nothing else", () => {
    const entry = {
      id: "m",
      task: "text-generation",
      architecture: "causal-lm",
      source: { path: "m" },
      format: "hf-safetensors",
      dtypes: ["float32"],
      default_dtype: "float32",
      limits: { max_batch: 1, max_seq_len: 8, max_new_tokens: 8, max_text_chars: 8 },
    };
    const c = parseCatalog({
      model_roots: ["."],
      models: [entry, { ...entry, id: "v", engine: "vllm" }],
    });
    expect(c.models.map((m) => m.engine)).toEqual(["torch", "vllm"]);
    expect(() =>
      parseCatalog({ model_roots: ["."], models: [{ ...entry, engine: "tgi" }] }),
    ).toThrow(/engine/);
  });
});

// A fine-tune's result kept and served (issue 47 item 2), end to end: the real HTTP server, SDK
// clients of two principals and a real torch worker. One principal fine-tunes tiny-gpt2 with
// `keep`; the kept model loads (its sha256 checked), check_model passes on it and it answers
// greedily, differently from the model it came from, whose weights are untouched. The other
// principal is refused it exactly as an unknown model. A second keep over the storage bound is
// refused before it runs; the entry outlives a restart; weights changed on disk are refused at
// load; and under a tiny TTL the result is swept away.
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DEMO_POLICY,
  DEMO_TOKENS,
  ROOT,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";
import { call, type Client } from "./scenario.js";

const AGENT2 = "fine-tune-keep-second-agent-token";
const sha = (t: string | Buffer) => createHash("sha256").update(t).digest("hex");
const agent = DEMO_POLICY.tokens.find((t: any) => t.id === "agent");
const BASE_WEIGHTS = join(ROOT, ".data/models/tiny-gpt2/model.safetensors");

const TUNE = {
  model: "tiny-gpt2",
  work: "fine_tune",
  dataset: "us-founding-texts",
  batch_sizes: [2],
  seq_lens: [32],
  dtypes: ["float32"],
  steps: 6,
  eval_every: 3,
  learning_rate: 1e-3,
  keep: true,
};
const PROMPT = { texts: ["We the People of the United States"], max_new_tokens: 12 };

function config(dir: string, kept: Record<string, number>): string {
  return writeConfig(
    {
      kept,
      policy: {
        ...DEMO_POLICY,
        tokens: [...DEMO_POLICY.tokens, { ...agent, id: "agent2", token_sha256: sha(AGENT2) }],
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: { rules: [] },
      },
    },
    dir,
  );
}

async function ok(client: Client, tool: string, args: Record<string, unknown>) {
  const r = await call(client, tool, args);
  expect(r.isError, JSON.stringify(r).slice(0, 800)).toBeFalsy();
  return r.structuredContent;
}

async function until<T>(f: () => Promise<T | false>, ms: number): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe("a kept fine-tune: its owner's model, bounded, checked at load", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-keep-e2e-"));
  // Room for one kept tiny-gpt2 (8.3 MB of float32 weights), not two.
  const file = config(dir, { max_bytes_per_principal: 12 * 1024 ** 2, ttl_s: 86_400 });
  let srv: HttpServerProc;
  let kept: string;
  beforeAll(async () => {
    srv = await startHttpServer(file);
  }, scaled(120_000));
  afterAll(async () => srv?.stop());

  it(
    "keeps the fine-tuned weights as the owner's model: it loads, passes check_model and answers greedily; the base is untouched",
    { timeout: scaled(600_000) },
    async () => {
      const baseDigest = sha(readFileSync(BASE_WEIGHTS));
      const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
      try {
        await ok(a.client, "load_model", { model: "tiny-gpt2" });
        const before = await ok(a.client, "get_runtime_status", { weights_checksum: true });
        const baseChecksum = before.loaded.find(
          (l: any) => l.model === "tiny-gpt2",
        ).weights_checksum;
        const o = await ok(a.client, "run_benchmark", TUNE);
        expect(o.configs[0].status).toBe("completed");
        const k = o.manifest.kept;
        expect(k.model, JSON.stringify(k)).toMatch(/^kept-[0-9a-f]{12}$/);
        expect(k.sha256).toMatch(/^sha256:[0-9a-f]{64}$/);
        expect(k.bytes).toBeGreaterThan(1_000_000);
        expect(k).toMatchObject({ dtype: "float32", mode: "eager" });
        kept = k.model;
        // Written under the server's data folder, never over the model it came from.
        const keptDir = join(dir, "data", "kept", kept);
        expect(readdirSync(keptDir)).toContain("model.safetensors");
        expect(sha(readFileSync(BASE_WEIGHTS))).toBe(baseDigest);
        const after = await ok(a.client, "get_runtime_status", { weights_checksum: true });
        expect(after.loaded.find((l: any) => l.model === "tiny-gpt2").weights_checksum).toBe(
          baseChecksum,
        );

        const listed = await ok(a.client, "list_models", {});
        const row = listed.models.find((m: any) => m.id === kept);
        expect(row, "the owner's list shows the kept model").toBeTruthy();
        expect(row).toMatchObject({ task: "text-generation", available: true });

        const load = await ok(a.client, "load_model", { model: kept });
        expect(load.model).toBe(kept);
        const check = await ok(a.client, "check_model", { model: kept });
        expect(check.verdict).toBe("supported");
        const tuned = await ok(a.client, "run_inference", { model: kept, ...PROMPT });
        const again = await ok(a.client, "run_inference", { model: kept, ...PROMPT });
        const base = await ok(a.client, "run_inference", { model: "tiny-gpt2", ...PROMPT });
        // Greedy: the same answer twice; six AdamW steps at 1e-3 moved a random model's argmax.
        expect(again.texts).toEqual(tuned.texts);
        expect(tuned.texts).not.toEqual(base.texts);
        await ok(a.client, "unload_model", { model: kept });
      } finally {
        await a.close();
      }
    },
  );

  it("refuses it to another principal exactly as an unknown model, and hides it from their lists", async () => {
    expect(kept).toBeDefined();
    const b = await connectHttp(srv.url, AGENT2);
    const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
    try {
      await ok(a.client, "load_model", { model: kept });
      const unknown = errorOf(await call(b.client, "load_model", { model: "kept-000000000000" }));
      expect(unknown?.code).toBe("unknown_model");
      for (const [tool, args] of [
        ["load_model", {}],
        ["check_model", {}],
        ["run_inference", PROMPT],
        ["unload_model", {}],
      ] as const) {
        const r = errorOf(await call(b.client, tool, { model: kept, ...args }));
        expect(r, tool).toMatchObject({ code: "unknown_model", message: unknown!.message });
      }
      const listed = await ok(b.client, "list_models", {});
      expect(listed.models.map((m: any) => m.id)).not.toContain(kept);
      const status = await ok(b.client, "get_runtime_status", {});
      expect(status.loaded.map((m: any) => m.model)).not.toContain(kept);
      const own = await ok(a.client, "get_runtime_status", {});
      expect(own.loaded.map((m: any) => m.model)).toContain(kept);
      await ok(a.client, "unload_model", { model: kept });
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("refuses a keep over the principal's storage bound before the run, saying what to do", async () => {
    const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
    try {
      const r = await call(a.client, "run_benchmark", TUNE);
      expect(r.isError).toBe(true);
      expect(errorOf(r)?.code).toBe("storage_exceeded");
      expect(errorOf(r)?.message).toMatch(
        /kept\.max_bytes_per_principal.*wait for a kept result to expire/,
      );
      // Nothing ran: no second folder was written.
      expect(readdirSync(join(dir, "data", "kept")).filter((f) => f.startsWith("kept-"))).toEqual([
        kept,
      ]);
    } finally {
      await a.close();
    }
  });

  it(
    "survives a restart, and weights changed on disk are refused at load",
    { timeout: scaled(300_000) },
    async () => {
      await srv.stop();
      srv = await startHttpServer(file);
      const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
      try {
        const listed = await ok(a.client, "list_models", {});
        expect(listed.models.map((m: any) => m.id)).toContain(kept);
        // One byte of a tensor flipped: the header still parses, the digest no longer matches.
        const weights = join(dir, "data", "kept", kept, "model.safetensors");
        const bytes = readFileSync(weights);
        bytes[bytes.length - 1] ^= 0xff;
        writeFileSync(weights, bytes);
        const r = await call(a.client, "load_model", { model: kept });
        expect(errorOf(r)?.code, JSON.stringify(r)).toBe("unsafe_weights");
        expect(errorOf(r)?.message).toMatch(/sha256 differs/);
      } finally {
        await a.close();
      }
    },
  );
});

describe("a kept fine-tune under a tiny TTL", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-keep-ttl-e2e-"));
  let srv: HttpServerProc;
  beforeAll(async () => {
    srv = await startHttpServer(config(dir, { max_bytes_per_principal: 64 * 1024 ** 2, ttl_s: 2 }));
  }, scaled(120_000));
  afterAll(async () => srv?.stop());

  it(
    "is swept away when it expires: files removed, no longer listed or loadable",
    { timeout: scaled(600_000) },
    async () => {
      const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
      try {
        const o = await ok(a.client, "run_benchmark", TUNE);
        const id = o.manifest.kept.model;
        expect(id).toMatch(/^kept-[0-9a-f]{12}$/);
        const folder = join(dir, "data", "kept", id);
        await until(async () => !existsSync(folder), scaled(60_000));
        const listed = await ok(a.client, "list_models", {});
        expect(listed.models.map((m: any) => m.id)).not.toContain(id);
        const r = await call(a.client, "load_model", { model: id });
        expect(errorOf(r)?.code).toBe("unknown_model");
      } finally {
        await a.close();
      }
    },
  );
});

// What an agent pays in its context for the tool surface: the bytes (and ~tokens, at 4 bytes of
// JSON a token: no tokenizer is installed) of tools/list for each principal of the demo policy
// (examples/policy.demo.json), and of a typical result of each tool, as the server sends them to
// the SDK's real client. Every principal's list is read over stdio with that principal's scopes
// (so BENCH_BASELINE=<checkout> measures another version side by side), the agent's also over
// HTTP with its real token; the results are real calls of the demo agent over HTTP, a costly one
// approved by the operator through the CLI as a person would.
import { join } from "node:path";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import {
  CLI,
  DEMO_POLICY,
  DEMO_TOKENS,
  cli,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
} from "../test/helpers/server.js";
import { tokensOf, wireSize } from "../test/helpers/wire.js";
import { PYTHON, ROOT, startStdio, tempDir } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface TokensBenchOptions {
  /** Another checkout's bin/tpu-mcp.js: its tools/list per principal beside this one's. */
  baselineCli?: string;
  say: (msg: string) => void;
}

/** Every principal of the demo policy with the scopes it holds. */
function demoPrincipals(): { id: string; scopes: string[] }[] {
  return [
    { ...DEMO_POLICY.stdio_principal, id: `${DEMO_POLICY.stdio_principal.id} (stdio)` },
    ...DEMO_POLICY.tokens.map((t: { id: string; scopes: string[] }) => ({
      id: t.id,
      scopes: t.scopes,
    })),
  ];
}

/** The demo policy on the built-in catalog with a CPU worker; `lazy`: no worker until a call. */
function demoConfig(
  dir: string,
  lazy: boolean,
  stdioPrincipal?: { id: string; scopes: string[] },
): string {
  return writeConfig(
    {
      policy: {
        ...DEMO_POLICY,
        ...(stdioPrincipal
          ? { stdio_principal: { id: "bench-principal", scopes: stdioPrincipal.scopes } }
          : {}),
      },
      runtime: {
        python: PYTHON,
        catalog: join(ROOT, "runtime", "catalog.builtin.json"),
        device: "cpu",
        ...(lazy ? { start: "lazy" } : {}),
      },
    },
    dir,
  );
}

async function listBytes(
  configFile: string,
  cliPath: string,
): Promise<{ bytes: number; n: number }> {
  const s = await startStdio(configFile, cliPath);
  try {
    const { value, bytes } = await wireSize(s.client, () => s.client.listTools());
    return { bytes, n: value.tools.length };
  } finally {
    await s.close();
  }
}

export async function runTokens(opts: TokensBenchOptions): Promise<SectionResult> {
  const sec = section("tokens");
  const kb = (b: number) => `${(b / 1000).toFixed(1)} KB`;
  const est = (b: number) => `~${tokensOf(b).toLocaleString("en")} tokens`;

  // tools/list per principal, over stdio (the principal's scopes), this checkout and a baseline.
  for (const p of demoPrincipals()) {
    const key = p.id.split(" ")[0];
    const cfg = demoConfig(tempDir(), true, p);
    const now = await listBytes(cfg, CLI);
    sec.fig(`list.${key}.bytes`, now.bytes);
    sec.fig(`list.${key}.tokens`, tokensOf(now.bytes));
    let detail = `${est(now.bytes)}, ${now.n} tools`;
    if (opts.baselineCli) {
      const base = await listBytes(cfg, opts.baselineCli);
      sec.fig(`list.${key}.baseline_bytes`, base.bytes);
      detail += `; baseline ${base.bytes.toLocaleString("en")} B (${est(base.bytes)}, ${base.n} tools)`;
    }
    sec.row(`tools/list ${p.id}`, `${now.bytes.toLocaleString("en")} B`, detail);
  }

  // The agent with its real token over HTTP, then a typical result of each tool.
  const dir = tempDir();
  const config = demoConfig(dir, false);
  const srv = await startHttpServer(config);
  const agent = await connectHttp(srv.url, DEMO_TOKENS.agent);
  try {
    const list = await wireSize(agent.client, () => agent.client.listTools());
    sec.fig("list.agent_http.bytes", list.bytes);
    sec.row(
      "tools/list agent (HTTP, bearer token)",
      `${list.bytes.toLocaleString("en")} B`,
      `${est(list.bytes)} (${kb(list.bytes)}); target ≤ 12,000 B`,
    );

    const result = async (label: string, name: string, args: Record<string, unknown>) => {
      const { value, bytes } = await wireSize(agent.client, () =>
        callTool(agent.client, name, args),
      );
      const r = value as any;
      const text = (r.content ?? []).map((c: any) => (c.type === "text" ? c.text : "")).join("");
      const structured = r.structuredContent ? JSON.stringify(r.structuredContent) : "";
      const code = errorOf(r)?.code;
      sec.fig(`result.${label}.bytes`, bytes);
      sec.row(
        `${name} ${label.split(".").slice(1).join(" ") || ""}`.trim(),
        `${bytes.toLocaleString("en")} B`,
        `${est(bytes)}; structuredContent ${Buffer.byteLength(structured)} B, text ${Buffer.byteLength(text)} B` +
          (code ? `; error ${code}` : ""),
      );
      return r;
    };
    /** A call the demo policy holds for approval: the operator approves it through the CLI. */
    const approved = async (label: string, name: string, args: Record<string, unknown>) => {
      const asked = await result(`${label}.approval_required`, name, args);
      const id = errorOf(asked)?.details?.approval_id;
      if (!id) return asked;
      const ok = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
      if (ok.code !== 0) throw new Error(`approve ${id}: ${ok.stderr}`);
      return result(label, name, { ...args, approval_id: id });
    };

    await result("get_runtime_status", "get_runtime_status", {});
    await result("list_models", "list_models", {});
    await result("check_model.mnist-cnn", "check_model", { model: "mnist-cnn" });
    await result("load_model.mnist-cnn", "load_model", { model: "mnist-cnn" });
    await result("run_inference.mnist-cnn_1x784", "run_inference", {
      model: "mnist-cnn",
      tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.5) }],
    });
    await approved("load_model.all-minilm-l6-v2", "load_model", { model: "all-minilm-l6-v2" });
    await result("run_inference.minilm_3_texts", "run_inference", {
      model: "all-minilm-l6-v2",
      texts: ["A man is playing a guitar.", "A man plays music.", "Stocks fell today."],
    });
    const job = await result("load_model.tiny-gpt2_wait_false", "load_model", {
      model: "tiny-gpt2",
      wait: false,
    });
    const jobId = job.structuredContent?.job_id as string;
    for (let i = 0; i < 600; i++) {
      const j = await callTool(agent.client, "get_job", { job_id: jobId });
      if ((j as any).structuredContent?.status !== "running") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    await result("get_job.load_finished", "get_job", { job_id: jobId });
    await result("cancel_job.finished_job", "cancel_job", { job_id: jobId });
    await result("run_inference.tiny-gpt2_16_tokens", "run_inference", {
      model: "tiny-gpt2",
      texts: ["The accelerator"],
      max_new_tokens: 16,
    });
    await approved("run_benchmark.mnist-cnn_2_configs", "run_benchmark", {
      model: "mnist-cnn",
      batch_sizes: [1, 2],
      iterations: 5,
      warmup: 1,
    });
    await result("unload_model.mnist-cnn", "unload_model", { model: "mnist-cnn" });
  } finally {
    await agent.close();
    await srv.stop();
  }
  sec.note(
    "tokens: ~tokens = bytes / 4 of the JSON-RPC result as sent (no tokenizer is installed); tools/list per principal over stdio with that principal's scopes, the agent also over HTTP with its token",
  );
  return sec.result();
}

function callTool(client: Client, name: string, args: Record<string, unknown>) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 600_000 });
}

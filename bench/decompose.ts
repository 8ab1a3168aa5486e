// 0. Decomposition: where the time of one batch-1 run_inference call goes, from timestamps
// carried ON the call (not guessed). The server runs with `trace_calls: true`; a call that asks
// with `_meta["tpu-mcp/trace"]` is stamped by every layer it crosses — the stdio transport, the
// SDK dispatch, input validation, the estimate, each gate stage, the audit writes, the handler,
// the runtime client, and inside the worker its reader, queue, batcher, forward and reply — and
// the stamps come back in the result's _meta. This side adds the client's own stamps (request
// written, response read, callTool returned). All stamps are CLOCK_MONOTONIC µs, one clock for
// the three processes (Linux), so segments across process boundaries are real differences.
//
// Beside it, interleaved call by call: the same call untraced (what tracing itself costs), the
// SDK floor (bench/echo_server.ts: an echo tool on the same transport, same arguments, a result
// of the same shape with an output schema) and the direct forward in Python.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import { CLI } from "../test/helpers/server.js";
import { monotonicUs, TRACE_META_KEY } from "../tools/support/trace.js";
import { DirectPython, ROOT } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, percentile } from "./lib/stats.js";

export interface DecomposeOptions {
  config: string;
  catalog: string;
  model: string;
  calls: number;
  warmup: number;
}

/** What each segment between two consecutive stamps is. */
const LABELS: Record<string, string> = {
  "c.start→c.sent": "client: SDK request, JSON, write",
  "c.sent→s.recv": "pipe client → server",
  "s.recv→s.parsed": "server transport: JSON.parse + JSON-RPC schema",
  "s.parsed→s.handler": "SDK: request schema + routing",
  "s.handler→d.parsed": "tool input schema (zod)",
  "d.parsed→d.estimated": "cost estimate",
  "d.estimated→g.start": "dispatch → gate",
  "g.start→g.digest": "gate: redact + argument digest",
  "g.digest→g.approval": "gate: scope, memory fit, approval",
  "g.approval→g.rate": "gate: rate limit",
  "g.rate→g.budget": "gate: budget check",
  "g.budget→g.slot": "gate: concurrency slot",
  "g.slot→g.audit_allowed": "gate: audit 'allowed'",
  "g.audit_allowed→h.start": "gate: timeout + abort set-up",
  "h.start→rt.call": "handler: checks, tensor from JSON",
  "rt.call→rt.written": "runtime: encode + write frame",
  "rt.written→w.arrived": "pipe server → worker",
  "w.arrived→w.parsed": "worker reader: parse frame",
  "w.parsed→w.op_thread": "worker: reader → op thread",
  "w.op_thread→w.queued": "worker: prepare input",
  "w.parsed→w.queued": "worker: prepare input",
  "w.queued→w.taken": "worker: queue → batcher",
  "w.taken→w.forward_done": "forward (batch of 1)",
  "w.forward_done→w.woke": "worker: batcher → op thread",
  "w.woke→w.reply": "worker: result header",
  "w.forward_done→w.reply": "worker: result header",
  "w.reply→rt.frame_arrived": "worker encode + write, pipe worker → server",
  "rt.frame_arrived→rt.frame_decoded": "runtime: decode frame",
  "rt.frame_decoded→h.resumed": "runtime → handler (promise)",
  "h.resumed→h.outputs": "handler: outputs to JSON",
  "h.outputs→g.work_done": "handler → gate",
  "g.work_done→g.audit_executed": "gate: audit 'executed'",
  "g.audit_executed→d.gate_done": "gate: release, budget charge",
  "d.gate_done→d.result": "result + text rendering",
  "d.result→s.handler_done": "metrics",
  "s.handler_done→c.received": "SDK response, JSON, pipe server → client",
  "c.received→c.done": "client: JSON-RPC + output schema check",
};

interface Traced {
  client: Client;
  /** The client transport's stamps of the last request written and response read. */
  last: { sent: number; received: number };
  close(): Promise<void>;
}

async function tracedStdio(command: string, args: string[]): Promise<Traced> {
  const transport = new StdioClientTransport({ command, args, cwd: ROOT, stderr: "pipe" });
  let tail = "";
  transport.stderr?.on("data", (d: Buffer) => (tail = (tail + d.toString()).slice(-4000)));
  const client = new Client({ name: "tpu-mcp-bench-decompose", version: "0.0.0" });
  try {
    await client.connect(transport);
  } catch (e) {
    throw new Error(`${command} ${args.join(" ")} did not start: ${(e as Error).message}\n${tail}`);
  }
  const last = { sent: 0, received: 0 };
  const send = transport.send.bind(transport);
  transport.send = (m: JSONRPCMessage) => {
    const p = send(m); // the write happens synchronously inside
    if ("method" in m && m.method === "tools/call") last.sent = monotonicUs();
    return p;
  };
  const onmessage = transport.onmessage!;
  transport.onmessage = (m: JSONRPCMessage) => {
    if ("result" in m) last.received = monotonicUs();
    onmessage(m);
  };
  return { client, last, close: () => client.close() };
}

export async function runDecompose(o: DecomposeOptions): Promise<SectionResult> {
  const s = section("decompose");
  const values = Array.from({ length: 784 }, (_, i) => ((i * 37) % 255) / 255);
  const args = {
    model: o.model,
    tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: values }],
  };
  const [mcp, echo, direct] = await Promise.all([
    tracedStdio(process.execPath, [CLI, "stdio", "--config", o.config]),
    tracedStdio(`${ROOT}/node_modules/.bin/tsx`, [`${ROOT}/bench/echo_server.ts`]),
    DirectPython.start(o.catalog, o.model),
  ]);
  try {
    await mcp.client.callTool({ name: "load_model", arguments: { model: o.model } });
    const call = async (t: Traced, name: string, meta: boolean) => {
      const t0 = monotonicUs();
      const r = await t.client.callTool({
        name,
        arguments: name === "echo" ? { ...args, out: 10 } : args,
        ...(meta ? { _meta: { [TRACE_META_KEY]: {} } } : {}),
      });
      const t1 = monotonicUs();
      if (r.isError) throw new Error(`${name} failed: ${JSON.stringify(r.content).slice(0, 300)}`);
      return { r, t0, t1 };
    };
    const segs = new Map<string, number[]>();
    const totals = { traced: [] as number[], untraced: [] as number[], floor: [] as number[] };
    const floorParts = { client: [] as number[], server: [] as number[] };
    const directMs: number[] = [];
    const workerForward: number[] = [];
    const sides = ["traced", "untraced", "floor", "direct"] as const;
    for (let i = 0; i < o.warmup + o.calls; i++) {
      const record = i >= o.warmup;
      for (let k = 0; k < sides.length; k++) {
        const side = sides[(i + k) % sides.length];
        if (side === "direct") {
          const [ms] = await direct.inferTensor([1, 1, 28, 28], values, 1);
          if (record) directMs.push(ms * 1000);
        } else if (side === "floor") {
          const { t0, t1 } = await call(echo, "echo", false);
          if (record) {
            totals.floor.push(t1 - t0);
            floorParts.client.push(echo.last.sent - t0 + (t1 - echo.last.received));
            floorParts.server.push(echo.last.received - echo.last.sent);
          }
        } else if (side === "untraced") {
          const { t0, t1 } = await call(mcp, "run_inference", false);
          if (record) totals.untraced.push(t1 - t0);
        } else {
          const { r, t0, t1 } = await call(mcp, "run_inference", true);
          if (!record) continue;
          totals.traced.push(t1 - t0);
          const server = (r._meta?.[TRACE_META_KEY] as { marks?: [string, number][] })?.marks;
          if (!server) throw new Error("no trace in the result: is trace_calls on in the config?");
          const marks: [string, number][] = [
            ["c.start", t0],
            ["c.sent", mcp.last.sent],
            ...server,
            ["c.received", mcp.last.received],
            ["c.done", t1],
          ];
          for (let j = 1; j < marks.length; j++) {
            const key = `${marks[j - 1][0]}→${marks[j][0]}`;
            if (!segs.has(key)) segs.set(key, []);
            segs.get(key)!.push(marks[j][1] - marks[j - 1][1]);
          }
          const fwd = server.find((m) => m[0] === "w.taken");
          const done = server.find((m) => m[0] === "w.forward_done");
          if (fwd && done) workerForward.push(done[1] - fwd[1]);
        }
      }
    }
    const us = (x: number) => `${x.toFixed(0)} µs`;
    const p50 = (xs: number[]) => percentile(xs, 50);
    for (const [key, xs] of segs) {
      const label = LABELS[key] ?? key;
      s.row(`${label}`, us(p50(xs)), `p90 ${us(percentile(xs, 90))}; ${key}`);
      s.fig(`seg.${key}_p50_us`, p50(xs));
    }
    const sumP50 = [...segs.values()].reduce((a, xs) => a + p50(xs), 0);
    s.row("sum of segment p50s", us(sumP50));
    const add = (name: string, xs: number[], detail?: string) => {
      s.row(
        name,
        us(p50(xs)),
        `p99 ${us(percentile(xs, 99))}; n=${xs.length}${detail ? "; " + detail : ""}`,
      );
      s.fig(`${name.replace(/[^a-z0-9]+/gi, "_").toLowerCase()}_p50_us`, p50(xs));
      s.fig(`${name.replace(/[^a-z0-9]+/gi, "_").toLowerCase()}_p99_us`, percentile(xs, 99));
    };
    add("total, traced call", totals.traced);
    add("total, untraced call", totals.untraced, "the same call without stamps");
    add("SDK floor: echo tool, same transport", totals.floor);
    add("  of which client side", floorParts.client);
    add("  of which pipe + echo server", floorParts.server);
    add("direct forward in Python", directMs, "prepare + forward, no server");
    add("forward inside the worker", workerForward, "w.taken → w.forward_done");
    const added = p50(totals.untraced) - p50(directMs);
    s.row(
      "untraced call − direct forward",
      us(added),
      `${fmt.ms(added / 1000)} added; SDK floor is ${fmt.ms(p50(totals.floor) / 1000)} of it`,
    );
    s.fig("added_p50_us", added);
    s.note(
      `decompose: ${o.model} batch 1 over stdio, tensors as JSON numbers (784 values in, 10 out); each segment is the p50 of the difference between two consecutive stamps over ${o.calls} calls, interleaved with untraced calls, the SDK floor (bench/echo_server.ts) and the direct forward.`,
    );
  } finally {
    await Promise.allSettled([mcp.close(), echo.close(), direct.close()]);
  }
  return s.result();
}

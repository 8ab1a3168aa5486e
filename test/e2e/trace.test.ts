// Per-call tracing (config `trace_calls`), as `npm run bench`'s decomposition uses it: a real
// server and worker, a real SDK client. Stamps come back only when the server enables tracing
// AND the call asks for it; they follow the call through every layer, on one monotonic clock.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TRACE_META_KEY } from "../../tools/support/trace.js";
import { connectStdio, writeConfig } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const args = {
  model: "mnist-cnn",
  tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.5) }],
};
const traced = { [TRACE_META_KEY]: {} };

describe("trace_calls", () => {
  let on: Awaited<ReturnType<typeof connectStdio>>;
  let off: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    [on, off] = await Promise.all([
      connectStdio(writeConfig({ trace_calls: true })),
      connectStdio(writeConfig()),
    ]);
    await Promise.all([
      on.client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } }),
      off.client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } }),
    ]);
  }, scaled(120_000));
  afterAll(async () => {
    await Promise.allSettled([on?.close(), off?.close()]);
  });

  it("stamps a call that asks, through transport, gate, runtime and worker, in order", async () => {
    const r = await on.client.callTool({ name: "run_inference", arguments: args, _meta: traced });
    expect(r.isError).toBeFalsy();
    const marks = (r._meta?.[TRACE_META_KEY] as { marks: [string, number][] }).marks;
    const stages = marks.map((m) => m[0]);
    for (const stage of [
      "s.recv",
      "s.handler",
      "d.parsed",
      "g.digest",
      "g.audit_allowed",
      "rt.written",
      "w.arrived",
      "w.queued",
      "w.taken",
      "w.forward_done",
      "w.reply",
      "rt.frame_arrived",
      "g.audit_executed",
      "s.handler_done",
    ])
      expect(stages).toContain(stage);
    // One clock for both processes: the worker's stamps sit between the runtime's write and read.
    const at = (s: string) => marks.find((m) => m[0] === s)![1];
    expect(at("rt.written")).toBeLessThanOrEqual(at("w.reply"));
    expect(at("w.arrived")).toBeLessThanOrEqual(at("rt.frame_arrived"));
    expect(at("s.recv")).toBeLessThanOrEqual(at("s.handler_done"));
    expect(at("g.audit_allowed")).toBeLessThanOrEqual(at("w.arrived"));
    expect(at("w.reply")).toBeLessThanOrEqual(at("g.audit_executed"));
  });

  it("leaves calls that do not ask, and servers that do not trace, unstamped", async () => {
    const plain = await on.client.callTool({ name: "run_inference", arguments: args });
    expect(plain._meta?.[TRACE_META_KEY]).toBeUndefined();
    const asked = await off.client.callTool({
      name: "run_inference",
      arguments: args,
      _meta: traced,
    });
    expect(asked.isError).toBeFalsy();
    expect(asked._meta?.[TRACE_META_KEY]).toBeUndefined();
  });
});

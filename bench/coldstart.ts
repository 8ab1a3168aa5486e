// 4. Cold start of `tpu-mcp stdio` (config runtime.start = eager, the default): from spawning
// the process to tools/list answered, to the worker ready (get_runtime_status polled), to the
// first inference (load_model of the embedding model, then one run_inference).
// Next to it, side by side: a bare `node -e 0` and `node` + the tsx loader importing nothing,
// so the figure can be read against what Node itself costs on this machine right now.
import { spawnSync } from "node:child_process";
import { MODEL, startStdio, workerPid } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, median } from "./lib/stats.js";

export interface ColdStartOptions {
  config: string;
  reps: number;
}

function processStart(args: string[]): number {
  const t0 = performance.now();
  const r = spawnSync(process.execPath, args, { stdio: "ignore" });
  if (r.status !== 0) throw new Error(`node ${args.join(" ")} failed`);
  return (performance.now() - t0) / 1000;
}

export async function runColdStart(o: ColdStartOptions): Promise<SectionResult> {
  const s = section("coldstart");
  const t = {
    list: [] as number[],
    ready: [] as number[],
    infer: [] as number[],
    load: [] as number[],
  };
  const base = { node: [] as number[], tsx: [] as number[] };
  for (let i = 0; i < o.reps; i++) {
    base.node.push(processStart(["-e", "0"]));
    base.tsx.push(processStart(["--import", "tsx", "-e", "0"]));
    const t0 = performance.now();
    const srv = await startStdio(o.config); // spawn + MCP initialize
    await srv.client.listTools();
    t.list.push((performance.now() - t0) / 1000);
    await workerPid(srv);
    t.ready.push((performance.now() - t0) / 1000);
    const l0 = performance.now();
    await srv.call("load_model", { model: MODEL });
    t.load.push((performance.now() - l0) / 1000);
    await srv.call("run_inference", { model: MODEL, texts: ["a first sentence"] });
    t.infer.push((performance.now() - t0) / 1000);
    await srv.close();
  }
  const m = {
    list: median(t.list),
    ready: median(t.ready),
    infer: median(t.infer),
    load: median(t.load),
  };
  s.row(
    "start → tools/list answered",
    fmt.s(m.list),
    `median of ${o.reps}; bare node ${fmt.s(median(base.node))}, node+tsx ${fmt.s(median(base.tsx))}`,
  );
  s.row("start → worker ready", fmt.s(m.ready), "get_runtime_status polled every 50 ms");
  s.row("start → first inference", fmt.s(m.infer), `includes load_model ${fmt.s(m.load)}`);
  s.fig("tools_list_s", m.list);
  s.fig("worker_ready_s", m.ready);
  s.fig("first_inference_s", m.infer);
  s.fig("load_model_s", m.load);
  s.fig("bare_node_s", median(base.node));
  s.fig("node_tsx_s", median(base.tsx));
  return s.result();
}

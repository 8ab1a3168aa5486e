import { spawn } from "node:child_process";
import { join } from "node:path";
import { WorkerRuntime } from "../runtime/client.js";
import { quietLogger } from "./concurrency.js";
import { PYTHON, ROOT } from "./lib/procs.js";
import { median } from "./lib/stats.js";
async function main() {
  const a = new WorkerRuntime({ repoRoot: ROOT, pythonPath: PYTHON, logger: quietLogger, heartbeatTimeoutMs: 600000,
    spawn: (cmd, _a, opts) => spawn(cmd, [join(ROOT, "bench", "pipe_echo.py")], opts) });
  const h = await a.start();
  const py = spawn(join(ROOT, ".venv/bin/py-spy"), ["record", "-p", String(h.pid), "-o", "/tmp/prof/echo.txt", "-f", "raw", "-d", "12", "-r", "500", "--threads", "--idle", "--nonblocking"], { stdio: "inherit" });
  await new Promise((r) => setTimeout(r, 1500));
  const bytes = 16 << 20; const t = { dtype: "float32" as const, shape: [bytes / 4], data: Buffer.alloc(bytes, 1) };
  const res: number[] = []; const t1 = performance.now();
  while (performance.now() - t1 < 8000) { const t0 = performance.now(); await a.call("echo", {}, { tensors: [t] }); res.push(performance.now() - t0); }
  console.log("echo 16MiB median", median(res).toFixed(1), "ms n", res.length);
  await new Promise((r) => py.on("exit", r));
  await a.close();
}
main();

// The build without tracing, for the overhead section's side by side: BENCH_BASELINE when it
// names a checkout, else the commit just before OpenTelemetry tracing came in (the parent of the
// commit that added server/app/telemetry.ts), unpacked with `git archive` into a temp dir that
// shares this checkout's node_modules and .venv. And an OTLP/HTTP sink for the traced side.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, symlinkSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT } from "./procs.js";

export function baselineCheckout(): { dir: string; ref: string } {
  if (process.env.BENCH_BASELINE) return { dir: process.env.BENCH_BASELINE, ref: "BENCH_BASELINE" };
  const git = (...args: string[]) =>
    execFileSync("git", args, { cwd: ROOT, encoding: "utf8" }).trim();
  const added = git("log", "-1", "--format=%H", "--diff-filter=A", "--", "server/app/telemetry.ts");
  if (!added) throw new Error("no commit added server/app/telemetry.ts: set BENCH_BASELINE");
  const ref = git("rev-parse", "--short", `${added}^`);
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-baseline-"));
  execFileSync("sh", ["-c", `git archive ${ref} | tar -x -C "${dir}"`], { cwd: ROOT });
  for (const link of ["node_modules", ".venv"])
    if (existsSync(join(ROOT, link))) symlinkSync(join(ROOT, link), join(dir, link));
  return { dir, ref };
}

/** Takes OTLP/HTTP exports and answers 200, counting them (what a collector costs the server). */
export async function otlpSink(): Promise<{
  url: string;
  posts: () => number;
  close(): Promise<void>;
}> {
  let posts = 0;
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      posts++;
      res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    posts: () => posts,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

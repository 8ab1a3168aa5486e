#!/usr/bin/env node
// Runs test suites beside each other instead of one after another, and fails when any fails.
//   node scripts/side_by_side.mjs NAME COMMAND [NAME COMMAND]...
// Each COMMAND runs in a shell, in a process group of its own. The first one's output streams
// live; each other one's goes to a log file (its path printed at the start, to follow it with
// `tail -f`) that is printed whole once every part has ended, so two suites' lines never mix.
// Used by `npm test` (vitest beside pytest: most of a vitest file's time is spent waiting on its
// servers and workers, which leaves a core to pytest) and by .ci/run (two lanes of suites).
// TPU_MCP_SIDE_BY_SIDE=0 runs the parts one after another, in the order given (to time them alone).
import { spawn } from "node:child_process";
import { createWriteStream, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const say = (line) => process.stderr.write(`[side-by-side] ${line}\n`);

/** Starts one part; resolves with its exit code (a signal counts as a failure) and seconds. */
function start(part, log) {
  const t0 = performance.now();
  const child = spawn(part.command, {
    shell: true,
    detached: true,
    stdio: ["ignore", log ? "pipe" : "inherit", log ? "pipe" : "inherit"],
  });
  if (log) {
    child.stdout.pipe(log, { end: false });
    child.stderr.pipe(log, { end: false });
  }
  const done = new Promise((resolve) => {
    child.once("error", (e) => {
      if (log) log.write(`${e.message}\n`);
      resolve({ code: 127 });
    });
    child.once("close", (code, signal) => resolve({ code: code ?? (signal ? 128 : 1) }));
  }).then(({ code }) => ({ ...part, code, seconds: (performance.now() - t0) / 1000 }));
  return { child, done };
}

/**
 * Runs `parts` ({ name, command }) beside each other (or one after another when `together` is
 * false) and returns each one's { name, code, seconds, log } in the order given.
 */
export async function sideBySide(parts, { together = true, logDir } = {}) {
  const dir = logDir ?? mkdtempSync(join(tmpdir(), "tpu-mcp-parts-"));
  const running = new Set();
  const stop = (signal) => {
    for (const c of running) {
      try {
        process.kill(-c.pid, signal);
      } catch {
        // already gone
      }
    }
    process.exit(130);
  };
  process.once("SIGINT", () => stop("SIGINT"));
  process.once("SIGTERM", () => stop("SIGTERM"));

  const results = [];
  const runOne = (part, i) => {
    const logPath = i === 0 ? null : join(dir, `${i}-${part.name.replace(/[^\w.-]+/g, "_")}.log`);
    const log = logPath ? createWriteStream(logPath) : null;
    if (logPath) say(`${part.name}: output in ${logPath}`);
    const { child, done } = start(part, log);
    running.add(child);
    return done.then(async (r) => {
      running.delete(child);
      if (log) await new Promise((res) => log.end(res));
      return { ...r, log: logPath };
    });
  };
  if (together) results.push(...(await Promise.all(parts.map(runOne))));
  else for (const [i, p] of parts.entries()) results.push(await runOne(p, i));
  return results;
}

/** NAME COMMAND pairs from the command line. */
export function parseParts(argv) {
  if (argv.length === 0 || argv.length % 2 !== 0)
    throw new Error(
      `side_by_side.mjs takes NAME COMMAND pairs (got ${argv.length} argument(s)); e.g. node scripts/side_by_side.mjs vitest "vitest run" pytest "npm run test:py"`,
    );
  const parts = [];
  for (let i = 0; i < argv.length; i += 2) parts.push({ name: argv[i], command: argv[i + 1] });
  return parts;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  let parts;
  try {
    parts = parseParts(process.argv.slice(2));
  } catch (e) {
    say(e.message);
    process.exit(2);
  }
  const together = process.env.TPU_MCP_SIDE_BY_SIDE !== "0";
  const t0 = performance.now();
  const results = await sideBySide(parts, { together });
  for (const r of results) {
    if (!r.log) continue;
    process.stdout.write(`\n[side-by-side] ---- ${r.name} (${r.log}) ----\n`);
    process.stdout.write(readFileSync(r.log));
  }
  const wall = Math.round((performance.now() - t0) / 1000);
  for (const r of results)
    say(
      `${r.name}: ${r.code === 0 ? "passed" : `FAILED (exit ${r.code})`} in ${Math.round(r.seconds)} s`,
    );
  say(`${together ? "beside each other" : "one after another"}: ${wall} s in all`);
  process.exit(results.some((r) => r.code !== 0) ? 1 : 0);
}

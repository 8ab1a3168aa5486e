// `tpu-mcp doctor`, the Ray fleet section (runtime.ray): can the fleet driver start, and will its
// actors live? Checks the files the config names, that Ray is installed, the cluster itself
// (reachable, checks tokens: a random token is refused, and accepts this config's token), then
// what the actors will need on the nodes they may land on, asked there by the driver's own
// pre-check (tpu_worker.fleet.preflight): the worker package imports, the device they will ask for
// exists, actor.catalog is there. Without runtime.ray it says so and touches nothing.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ServerConfig } from "../config/config.js";
import { driverConfig } from "../config/ray.js";

export interface FleetCheck {
  name: string;
  ok: boolean;
  detail: string;
}

const TIMEOUT_MS = 60_000;
/** One Ray task per node, each with its own worker process to start: slower than a GCS call. */
const PREFLIGHT_TIMEOUT_MS = 150_000;

function py(
  config: ServerConfig,
  args: string[],
  env: NodeJS.ProcessEnv,
  timeoutMs = TIMEOUT_MS,
): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const child = spawn(config.paths.python, args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...env, PYTHONPATH: config.paths.install.workerDir },
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (d) => (out += d.toString()));
    child.stderr.on("data", (d) => (err = (err + d.toString()).slice(-4000)));
    const t = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (e) => {
      clearTimeout(t);
      resolve({ code: null, out, err: String(e) });
    });
    child.on("close", (code) => {
      clearTimeout(t);
      resolve({ code, out: out.trim(), err: err.trim() });
    });
  });
}

/** A TCP connect to the GCS port: Ray itself takes 40 s to give up on an address that is down. */
function tcpReach(address: string, ms = 5000): Promise<string | null> {
  const i = address.lastIndexOf(":");
  const host = address.slice(0, i).replace(/^\[|\]$/g, "");
  const port = Number(address.slice(i + 1));
  return new Promise((resolve) => {
    const s = connect({ host, port });
    const done = (why: string | null) => {
      clearTimeout(t);
      s.destroy();
      resolve(why);
    };
    const t = setTimeout(() => done(`no answer within ${ms / 1000}s`), ms);
    s.once("connect", () => done(null));
    s.once("error", (e: NodeJS.ErrnoException) => done(e.code ?? e.message));
  });
}

/** Ray's client environment for this config (token auth, TLS), as the driver sets it. */
function rayEnv(ray: NonNullable<ServerConfig["runtime"]["ray"]>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.RAY_AUTH_TOKEN;
  delete env.RAY_AUTH_TOKEN_PATH;
  if (ray.tls) {
    env.RAY_USE_TLS = "1";
    env.RAY_TLS_SERVER_CERT = ray.tls.cert;
    env.RAY_TLS_SERVER_KEY = ray.tls.key;
    env.RAY_TLS_CA_CERT = ray.tls.ca;
  }
  return env;
}

export async function checkFleet(config: ServerConfig): Promise<FleetCheck[] | null> {
  const ray = config.runtime.ray;
  if (!ray) return null;
  const checks: FleetCheck[] = [];
  const file = (what: string, p: string | undefined) => {
    if (!p) return;
    try {
      accessSync(p, constants.R_OK);
      if (statSync(p).size === 0) throw new Error("empty");
      checks.push({ name: what, ok: true, detail: p });
    } catch (e) {
      checks.push({
        name: what,
        ok: false,
        detail: `cannot read ${p} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`,
      });
    }
  };
  file("runtime.ray.token_file", ray.token_file);
  file("runtime.ray.tls.ca", ray.tls?.ca);
  file("runtime.ray.tls.cert", ray.tls?.cert);
  file("runtime.ray.tls.key", ray.tls?.key);
  file("runtime.ray.channel.client_ca", ray.channel.client_ca);
  file("runtime.ray.channel.token_file", ray.channel.token_file);
  file("runtime.ray.client.cert", ray.client.cert);
  file("runtime.ray.client.key", ray.client.key);

  const version = await py(config, ["-c", "import ray; print(ray.__version__)"], process.env);
  if (version.code !== 0) {
    checks.push({
      name: "ray",
      ok: false,
      detail: `Ray is not installed for ${config.paths.python}: pip install -r runtime/worker/requirements-ray.txt (${version.err.split("\n").pop() ?? ""})`,
    });
    return checks;
  }
  checks.push({ name: "ray", ok: true, detail: `Ray ${version.out}` });

  const down = await tcpReach(ray.address);
  if (down) {
    checks.push({
      name: "cluster",
      ok: false,
      detail: `cannot reach the Ray cluster's GCS at ${ray.address} (${down}): is the head running, and its port open to this host?`,
    });
    return checks;
  }
  // Does the cluster check tokens? The driver's own probe, with a token no cluster holds.
  const probeEnv = {
    ...rayEnv(ray),
    RAY_AUTH_MODE: "token",
    RAY_AUTH_TOKEN: randomBytes(32).toString("hex"),
  };
  const probe = await py(config, ["-m", "tpu_worker.fleet.probe", ray.address], probeEnv);
  const verdict = probe.out.split("\n").pop() || `unreachable probe exited ${probe.code}`;
  const loopback = /^(127\.|\[::1\]|localhost:)/.test(ray.address);
  if (verdict.startsWith("unreachable")) {
    checks.push({
      name: "cluster",
      ok: false,
      detail: `cannot reach the Ray cluster at ${ray.address}: ${verdict.slice(12) || "no answer"}`,
    });
    return checks;
  }
  if (verdict === "open") {
    const allowed = ray.allow_insecure_local && loopback;
    checks.push({
      name: "cluster",
      ok: allowed,
      detail: allowed
        ? `${ray.address} reachable; it accepts clients without a token (allowed: allow_insecure_local on loopback)`
        : `${ray.address} accepts clients without a token: anyone who reaches its ports can run code there; start it with RAY_AUTH_MODE=token`,
    });
    if (!ray.token_file) {
      if (allowed) checks.push(...(await actorChecks(config)));
      return checks;
    }
  } else {
    checks.push({
      name: "cluster",
      ok: true,
      detail: `${ray.address} reachable and checks tokens`,
    });
  }
  if (!ray.token_file) return checks;
  // This config's token: accepted?
  const tokenEnv = { ...rayEnv(ray), RAY_AUTH_MODE: "token", RAY_AUTH_TOKEN_PATH: ray.token_file };
  const tok = await py(
    config,
    [
      "-c",
      "import sys\nfrom ray._raylet import GcsClient\nfrom ray.exceptions import AuthenticationError\n" +
        "try:\n  GcsClient(address=sys.argv[1]).internal_kv_get(b'tpu-mcp-probe', None, timeout=10)\n" +
        "except AuthenticationError:\n  print('refused')\nexcept Exception as e:\n  print('unreachable', type(e).__name__)\nelse:\n  print('accepted')",
      ray.address,
    ],
    tokenEnv,
  );
  const t = tok.out.split("\n").pop() ?? "";
  checks.push({
    name: "token",
    ok: t === "accepted",
    detail:
      t === "accepted"
        ? `the cluster accepts runtime.ray.token_file`
        : t === "refused"
          ? `the cluster refused runtime.ray.token_file ${ray.token_file}: use the cluster's token (\`ray get-auth-token\` on the head)`
          : `could not check the token: ${t || tok.err.split("\n").pop() || `exit ${tok.code}`}`,
  });
  if (t === "accepted") checks.push(...(await actorChecks(config)));
  return checks;
}

/**
 * What the actors will need, checked on the nodes by the driver's own pre-check with the
 * driver's config and Ray environment: one check per line of its output `{name, ok, detail}`.
 */
async function actorChecks(config: ServerConfig): Promise<FleetCheck[]> {
  const ray = config.runtime.ray!;
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-doctor-ray-"));
  try {
    const file = join(dir, "ray.json");
    writeFileSync(file, JSON.stringify(driverConfig(ray)), { mode: 0o600 });
    const r = await py(
      config,
      ["-m", "tpu_worker.fleet.preflight", "--config", file],
      rayEnv(ray),
      PREFLIGHT_TIMEOUT_MS,
    );
    return parsePreflight(r.out, r.err, r.code);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The pre-check's lines (Ray may print its own lines on stdout too: only ours are kept). */
export function parsePreflight(out: string, err: string, code: number | null): FleetCheck[] {
  const checks: FleetCheck[] = [];
  for (const line of out.split("\n")) {
    try {
      const c = JSON.parse(line) as Partial<FleetCheck>;
      if (typeof c.name === "string" && typeof c.ok === "boolean" && typeof c.detail === "string")
        checks.push({ name: c.name, ok: c.ok, detail: c.detail });
    } catch {
      // not one of ours
    }
  }
  if (checks.length) return checks;
  return [
    {
      name: "actor nodes",
      ok: false,
      detail: `could not check the nodes the actors will use (exit ${code ?? "killed: no answer in time"}): ${err.split("\n").pop() || "no output"}`,
    },
  ];
}

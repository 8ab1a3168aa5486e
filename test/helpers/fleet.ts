// Fleet test helpers: certificates made with openssl for the test, a real remote worker
// (`python -m tpu_worker serve`) on 127.0.0.1 with port 0, and a TCP relay whose connections the
// test can cut (a dropped network path between control plane and worker).
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { scaled } from "./calibrate.js";
import { ROOT } from "./server.js";

export interface Certs {
  dir: string;
  ca: string;
  workerCert: string;
  workerKey: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate signed by another CA: the worker must refuse it. */
  rogueCert: string;
  rogueKey: string;
  /** A worker certificate for 127.0.0.1 signed by another CA: the control plane must refuse it. */
  rogueWorkerCert: string;
  rogueWorkerKey: string;
  /** A worker certificate from the right CA for another name: the control plane must refuse it. */
  otherNameWorkerCert: string;
  otherNameWorkerKey: string;
  token: string;
  wrongToken: string;
}

function openssl(args: string[], cwd: string): void {
  execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] });
}

function keyAndCsr(cwd: string, name: string, cn: string): void {
  openssl(
    [
      "req",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:P-256",
      "-nodes",
      "-subj",
      `/CN=${cn}`,
    ].concat(["-keyout", `${name}.key`, "-out", `${name}.csr`]),
    cwd,
  );
}

function selfSignedCa(cwd: string, name: string, cn: string): void {
  openssl(
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:P-256",
      "-nodes",
      "-days",
      "2",
    ].concat(["-subj", `/CN=${cn}`, "-keyout", `${name}.key`, "-out", `${name}.crt`]),
    cwd,
  );
}

function sign(cwd: string, name: string, ca: string, ext?: string): void {
  const args = ["x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.crt`, "-CAkey", `${ca}.key`];
  args.push("-CAcreateserial", "-days", "2", "-out", `${name}.crt`);
  if (ext) args.push("-extfile", ext);
  openssl(args, cwd);
}

/** A CA, a worker certificate for 127.0.0.1, a control-plane client certificate, a rogue one. */
export function makeCerts(dir: string): Certs {
  mkdirSync(dir, { recursive: true });
  selfSignedCa(dir, "ca", "tpu-mcp test CA");
  selfSignedCa(dir, "rogue-ca", "someone else's CA");
  keyAndCsr(dir, "worker", "worker");
  // The README's recipe: workers serverAuth only, the control plane clientAuth (serve refuses others).
  writeFileSync(
    join(dir, "worker.ext"),
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
  );
  sign(dir, "worker", "ca", "worker.ext");
  writeFileSync(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
  keyAndCsr(dir, "client", "control-plane");
  sign(dir, "client", "ca", "client.ext");
  keyAndCsr(dir, "rogue", "control-plane");
  sign(dir, "rogue", "rogue-ca", "client.ext");
  keyAndCsr(dir, "rogue-worker", "worker");
  sign(dir, "rogue-worker", "rogue-ca", "worker.ext");
  writeFileSync(
    join(dir, "other.ext"),
    "subjectAltName=IP:10.9.9.9,DNS:elsewhere.example\nextendedKeyUsage=serverAuth\n",
  );
  keyAndCsr(dir, "other-worker", "elsewhere");
  sign(dir, "other-worker", "ca", "other.ext");
  const token = join(dir, "token");
  writeFileSync(token, "tok_" + "a1b2c3d4".repeat(6) + "\n", { mode: 0o600 });
  chmodSync(token, 0o600);
  const wrongToken = join(dir, "wrong-token");
  writeFileSync(wrongToken, "tok_" + "ffffffff".repeat(6) + "\n", { mode: 0o600 });
  const f = (n: string) => join(dir, n);
  return {
    dir,
    ca: f("ca.crt"),
    workerCert: f("worker.crt"),
    workerKey: f("worker.key"),
    clientCert: f("client.crt"),
    clientKey: f("client.key"),
    rogueCert: f("rogue.crt"),
    rogueKey: f("rogue.key"),
    rogueWorkerCert: f("rogue-worker.crt"),
    rogueWorkerKey: f("rogue-worker.key"),
    otherNameWorkerCert: f("other-worker.crt"),
    otherNameWorkerKey: f("other-worker.key"),
    token,
    wrongToken,
  };
}

export interface ServeProc {
  port: number;
  proc: ChildProcess;
  stderr: () => string;
  stop(): Promise<void>;
}

/** Starts `python -m tpu_worker serve` on 127.0.0.1:0 and resolves with the port it bound. */
export function startServe(certs: Certs, workerArgs: string[] = []): Promise<ServeProc> {
  const proc = spawn(
    join(ROOT, ".venv", "bin", "python"),
    [
      "-m",
      "tpu_worker",
      "serve",
      "--listen",
      "127.0.0.1:0",
      "--tls-cert",
      certs.workerCert,
      "--tls-key",
      certs.workerKey,
      "--client-ca",
      certs.ca,
      "--token-file",
      certs.token,
      "--catalog",
      join(ROOT, "runtime", "catalog.builtin.json"),
      "--device",
      "cpu",
      ...workerArgs,
    ],
    {
      cwd: ROOT,
      env: { ...process.env, PYTHONPATH: join(ROOT, "runtime", "worker") },
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let err = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`serve did not start:\n${err}`)),
      scaled(30_000),
    );
    proc.stderr!.on("data", (d: Buffer) => {
      err += d.toString();
      const m = /"msg": "listening"[^\n]*"port": (\d+)/.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve({
          port: Number(m[1]),
          proc,
          stderr: () => err,
          stop: () =>
            new Promise<void>((r) => {
              if (proc.exitCode !== null || proc.signalCode !== null) return r();
              proc.once("exit", () => r());
              proc.kill("SIGTERM");
            }),
        });
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited with ${code}:\n${err}`));
    });
  });
}

/** A TCP relay on 127.0.0.1:0 to `port`; cut() drops every connection through it. */
export async function tcpRelay(port: number) {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((a) => {
    const b = net.connect(port, "127.0.0.1");
    for (const s of [a, b]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    a.pipe(b);
    b.pipe(a);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: (server.address() as net.AddressInfo).port,
    connections: () => sockets.size / 2,
    cut() {
      for (const s of sockets) s.destroy();
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** What runtime/worker/tests_ray/cluster.py prints once its Ray cluster is up. */
export interface RayCluster {
  address: string;
  ray_token_file: string;
  catalog: string;
  ca: string;
  cert: string;
  key: string;
  token_file: string;
}

/**
 * A server's `runtime` section on a cluster from `startRayCluster`: `count` CPU actors placed one
 * per simulated chip, reached over its channel; `ray` overrides keys of the `ray` section.
 */
export function rayRuntime(c: RayCluster, count: number, ray: Record<string, unknown> = {}) {
  return {
    python: join(ROOT, ".venv/bin/python"),
    catalog: join(ROOT, "runtime/catalog.builtin.json"),
    device: "cpu",
    ray: {
      address: c.address,
      token_file: c.ray_token_file,
      placement: { mode: "per-chip", count, ready_timeout_s: 60 },
      actor: { catalog: c.catalog, device: "cpu", threads: 1, max_restarts: 3 },
      channel: { client_ca: c.ca, token_file: c.token_file },
      client: { cert: c.cert, key: c.key },
      ...ray,
    },
  };
}

/**
 * Starts a local Ray cluster (tests_ray/cluster.py: a token-auth head and simulated TPU hosts)
 * under `dir`, for the Ray suite and the Ray bench; the caller runs inside a loopback-only
 * network namespace. `stop()` ends it and resolves with cluster.py's exit code: 0 only when no
 * Ray process is left.
 */
export function startRayCluster(
  dir: string,
  python = join(ROOT, ".venv/bin/python"),
): Promise<{ info: RayCluster; log: () => string; stop: () => Promise<number | null> }> {
  const proc = spawn(python, [join(ROOT, "runtime/worker/tests_ray/cluster.py"), dir], {
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" },
  });
  let log = "";
  proc.stderr!.on("data", (d) => (log = (log + d.toString()).slice(-20_000)));
  const stop = () =>
    new Promise<number | null>((r) => {
      if (proc.exitCode !== null) return r(proc.exitCode);
      proc.once("exit", (code) => r(code));
      proc.stdin!.end();
    });
  return new Promise((resolve, reject) => {
    const t = setTimeout(
      () => reject(new Error(`the Ray cluster did not start:\n${log}`)),
      scaled(180_000),
    );
    createInterface({ input: proc.stdout! }).once("line", (line) => {
      clearTimeout(t);
      resolve({ info: JSON.parse(line) as RayCluster, log: () => log, stop });
    });
    proc.once("exit", (code) => reject(new Error(`cluster.py exited ${code}:\n${log}`)));
  });
}

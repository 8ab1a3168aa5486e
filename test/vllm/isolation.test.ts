// Nobody but the worker reaches the vLLM server it starts (issue 33): vLLM checks its API key under
// some path prefixes only (`POST /invocations` generates without it; `/tokenize`, `/metrics`,
// `/docs` answer anyone), so the server listens on no TCP port of the host at all. Its HTTP is a
// Unix socket in a 0700 directory of the worker's user; its own processes' ports (torch.distributed
// on a CPU host) are in a network namespace of its own. This suite enumerates every route the
// running server registers (vLLM's build_app on the server's own command line, and its live
// /openapi.json) and tries each as another OS user, and every port its processes listen on from
// the host: no connection, ever. Needs `npm run test:vllm` (.venv-vllm) and root (a second user).
import { execFile } from "node:child_process";
import { readFileSync, readdirSync, readlinkSync, statSync } from "node:fs";
import { request } from "node:http";
import { connect, createServer, type AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureUser, osUsersUnavailable, runAs, type OsUser } from "../helpers/os_user.js";
import { ROOT } from "../helpers/server.js";
import { cpuRuntime } from "../runtime/helpers.js";
import { VllmEngineSchema, engineArgs } from "../../server/config/engines.js";
import { ENGINE, VLLM, VLLM_PYTHON, writeCatalog } from "./fixture.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const ENTRY = ["-m", "vllm.entrypoints.openai.api_server"];

interface Route {
  path: string;
  methods: string[];
}

/** The processes of the server: it is started in a session of its own (pgid = its pid). */
function processGroup(leader: number): number[] {
  const pids: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[2]) === leader) pids.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Inodes of the sockets a process holds open. */
function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  return out;
}

/** The TCP ports `pid` listens on, read in its own network namespace. */
function tcpListeners(pid: number): { port: number; v6: boolean }[] {
  const mine = socketInodes(pid);
  const out: { port: number; v6: boolean }[] = [];
  for (const table of ["tcp", "tcp6"]) {
    for (const line of readFileSync(`/proc/${pid}/net/${table}`, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== "0A" || !mine.has(f[9])) continue; // 0A: LISTEN
      out.push({ port: parseInt(f[1].split(":")[1], 16), v6: table === "tcp6" });
    }
  }
  return out;
}

/** The paths of the Unix sockets `pid` listens on (in its own namespace's table). */
function unixListeners(pid: number): string[] {
  const mine = socketInodes(pid);
  const out: string[] = [];
  for (const line of readFileSync(`/proc/${pid}/net/unix`, "utf8").split("\n").slice(1)) {
    const f = line.trim().split(/\s+/);
    // Num RefCount Protocol Flags Type St Inode [Path]; flag 00010000: accepting connections.
    if (f.length >= 7 && f[3] === "00010000" && mine.has(f[6])) out.push(f[7] ?? "");
  }
  return out;
}

/** GET `path` over the Unix socket, as this process (the worker's user). */
function getOverSocket(
  socketPath: string,
  path: string,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path, method: "GET" }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

/**
 * Runs as `user`: every route over the socket and every port over TCP (v4 and v6 loopback), each
 * with a POST body where the route takes one; prints what each attempt got: "connected <status>"
 * or the connection's error code.
 */
const PROBE = `
const http = require("node:http"), net = require("node:net");
const { socketPath, routes, ports } = JSON.parse(process.argv[1]);
const out = { routes: [], ports: [] };
const tryRoute = (r, m) => new Promise((done) => {
  const body = m === "GET" ? undefined : JSON.stringify({ prompt: "hi", max_tokens: 4, model: "x" });
  const req = http.request({ socketPath, path: r.path.replace(/\\{[^}]+\\}/g, "x"), method: m,
    headers: body ? { "content-type": "application/json" } : {}, timeout: ${scaled(10_000)} }, (res) => {
    res.resume(); done("connected " + res.statusCode);
  });
  req.on("error", (e) => done(e.code || String(e)));
  req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "TIMEOUT" })));
  req.end(body);
});
const tryPort = (host, port) => new Promise((done) => {
  const s = net.connect({ host, port, timeout: ${scaled(5_000)} });
  s.on("connect", () => { s.destroy(); done("connected"); });
  s.on("timeout", () => { s.destroy(); done("TIMEOUT"); });
  s.on("error", (e) => done(e.code || String(e)));
});
(async () => {
  for (const r of routes) for (const m of r.methods) out.routes.push({ route: m + " " + r.path, got: await tryRoute(r, m) });
  for (const p of ports) out.ports.push({ port: p.port, got: await tryPort(p.v6 ? "::1" : "127.0.0.1", p.port) });
  console.log(JSON.stringify(out));
})();
`;

describe.skipIf(osUsersUnavailable() !== null)(
  "the vLLM server the worker starts: out of reach of anyone but the worker",
  () => {
    const { catalog } = writeCatalog();
    const rt = cpuRuntime({
      catalogPath: catalog,
      extraArgs: ["--threads", "1", ...engineArgs({ vllm: VllmEngineSchema.parse(ENGINE) })],
      requestTimeoutMs: 600_000,
    });
    let attacker: OsUser;
    let engine: any;
    let cmdline: string[];
    let socketPath: string;

    beforeAll(async () => {
      attacker = ensureUser("tpumcp-test-agent");
      await rt.call("load", { model: VLLM }, { timeoutMs: 600_000 });
      const status = await rt.call<any>("status", {});
      engine = status.result.loaded.find((m: any) => m.model === VLLM).engine;
      cmdline = readFileSync(`/proc/${engine.pid}/cmdline`, "utf8").split("\0").filter(Boolean);
      socketPath = cmdline[cmdline.indexOf("--uds") + 1];
    }, scaled(600_000));
    afterAll(async () => {
      await rt.close();
    });

    it("serves HTTP on a Unix socket in a 0700 directory of the worker's user, on no TCP port of the host", async () => {
      expect(engine).toMatchObject({ health: "ok", managed: true, network: "private" });
      expect(cmdline).toContain("--uds");
      expect(cmdline).not.toContain("--host");
      expect(cmdline).not.toContain("--port");
      const dir = statSync(dirname(socketPath));
      expect(dir.isDirectory()).toBe(true);
      expect(dir.mode & 0o777).toBe(0o700);
      expect(dir.uid).toBe(process.getuid!());
      // The worker's user reaches it (the worker does); nobody else may enter the directory.
      expect((await getOverSocket(socketPath, "/health")).status).toBe(200);
      const group = processGroup(engine.pid);
      expect(group.length).toBeGreaterThanOrEqual(2); // the API server, its engine core, its worker
      const hostNet = readlinkSync("/proc/self/ns/net");
      for (const pid of group) {
        // Every process of it in a network namespace of its own: its TCP ports are not the host's.
        expect(readlinkSync(`/proc/${pid}/ns/net`), `pid ${pid}`).not.toBe(hostNet);
        // Every Unix socket it listens on is inside the private directory (its ZMQ sockets too).
        for (const path of unixListeners(pid))
          expect(dirname(path), `pid ${pid}`).toBe(dirname(socketPath));
      }
    });

    it(
      "every route vLLM registers, and every port its processes listen on, is out of reach of another OS user and of any TCP client",
      { timeout: scaled(600_000) },
      async () => {
        // The routes of this very server: vLLM's build_app on its command line, and its live schema.
        const serverArgs = cmdline.slice(cmdline.indexOf(ENTRY[1]) + 1);
        const { stdout } = await run(
          VLLM_PYTHON,
          [join(ROOT, "test/vllm/vllm_routes.py"), ...serverArgs],
          {
            env: {
              PATH: process.env.PATH,
              HF_HUB_OFFLINE: "1",
              VLLM_NO_USAGE_STATS: "1",
              DO_NOT_TRACK: "1",
            },
            timeout: scaled(420_000),
            maxBuffer: 1 << 24,
          },
        );
        const routes: Route[] = JSON.parse(stdout.trim().split("\n").pop()!);
        const schema = JSON.parse((await getOverSocket(socketPath, "/openapi.json")).body);
        for (const [path, ops] of Object.entries<Record<string, unknown>>(schema.paths)) {
          const methods = Object.keys(ops).map((m) => m.toUpperCase());
          if (!routes.some((r) => r.path === path)) routes.push({ path, methods });
        }
        const paths = routes.map((r) => r.path);
        // What the attack of issue 33 used, among the rest.
        for (const p of [
          "/invocations",
          "/tokenize",
          "/detokenize",
          "/metrics",
          "/docs",
          "/openapi.json",
          "/v1/completions",
          "/v1/chat/completions",
          "/inference/v1/abort_requests",
          "/health",
        ])
          expect(paths).toContain(p);
        // Every TCP port the server's processes listen on (in their own namespace): tried from the
        // host's loopback. One that some other program of the host happens to listen on as well is
        // not the engine's (its processes are not in the host's namespace: the test above).
        const hostPorts = new Set(tcpListeners(process.pid).map((p) => p.port));
        const ports = processGroup(engine.pid).flatMap(tcpListeners);
        const probed = ports.filter((p) => !hostPorts.has(p.port));

        // The probe itself reports a connection where there is one: as the worker's user, on the
        // socket, and on a port that listens on the host's loopback.
        const open = createServer((c) => c.destroy());
        await new Promise<void>((r) => open.listen(0, "127.0.0.1", () => r()));
        try {
          const control = await probeAs(null, {
            socketPath,
            routes: [{ path: "/health", methods: ["GET"] }],
            ports: [{ port: (open.address() as AddressInfo).port, v6: false }],
          });
          expect(control).toEqual({
            routes: [{ route: "GET /health", got: "connected 200" }],
            ports: [{ port: (open.address() as AddressInfo).port, got: "connected" }],
          });
        } finally {
          open.close();
        }
        const probe = await probeAs(attacker, { socketPath, routes, ports: probed });
        expect(probe.routes.length).toBeGreaterThanOrEqual(routes.length);
        expect(probe.ports.length).toBe(probed.length);
        for (const a of probe.routes) expect(a.got, a.route).toBe("EACCES");
        for (const p of probe.ports) expect(p.got, `port ${p.port}`).toBe("ECONNREFUSED");
        // And as a process of the worker's own user without the key, over TCP: no port either.
        for (const p of probed)
          expect(await tcpConnect(p.v6 ? "::1" : "127.0.0.1", p.port), `port ${p.port}`).toBe(
            "ECONNREFUSED",
          );
      },
    );
  },
);

/** PROBE as `user` (node -e PROBE ARG), or as this process's user for null. */
async function probeAs(user: OsUser | null, arg: unknown): Promise<any> {
  const args = ["-e", PROBE, JSON.stringify(arg)];
  const res = user
    ? await runAs(user, process.execPath, args, { timeoutMs: 300_000 })
    : await run(process.execPath, args, { timeout: scaled(300_000) }).then((r) => ({
        code: 0,
        ...r,
      }));
  expect(res.code, res.stderr).toBe(0);
  return JSON.parse(res.stdout.trim().split("\n").pop()!);
}

/** A TCP connection attempt from this process: "connected" or the error's code. */
function tcpConnect(host: string, port: number): Promise<string> {
  return new Promise((done) => {
    const s = connect({ host, port, timeout: scaled(5000) });
    s.on("connect", () => {
      s.destroy();
      done("connected");
    });
    s.on("timeout", () => {
      s.destroy();
      done("TIMEOUT");
    });
    s.on("error", (e: NodeJS.ErrnoException) => done(e.code ?? String(e)));
  });
}

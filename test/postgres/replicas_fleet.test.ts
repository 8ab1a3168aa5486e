// One fleet, many replicas: two tpu-mcp replicas on one Postgres (and HAProxy, as deployed) whose
// only worker is the same remote worker, ONE `python -m tpu_worker serve` (mutual TLS + token on
// 127.0.0.1, certificates made by the test). The relay in serve serves both replicas at once from
// one worker process and tells each what the other loads and unloads (`fleet` frames), so: a
// model loaded through A runs through B without a load on B, B's load of it is answered without a
// second load, both replicas' status shows the same worker and models, an unload through B is gone
// for A, and a replica killed mid-traffic leaves the other's calls working and the model loaded.
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeCerts, startServe, type Certs, type ServeProc } from "../helpers/fleet.js";
import { startDeployment, type Deployment } from "../helpers/replicas.js";
import { ROOT, connectHttp, errorOf } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const MINILM = "all-minilm-l6-v2";
const SCOPES = ["models:read", "models:load", "models:unload", "inference:run", "admin"];
const token = `tpu_${randomBytes(18).toString("base64url")}`;
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

type Conn = Awaited<ReturnType<typeof connectHttp>>;

async function call(conn: Conn, name: string, args: Record<string, unknown> = {}): Promise<any> {
  return conn.client.callTool({ name, arguments: args }, undefined, { timeout: scaled(600_000) });
}

async function status(conn: Conn): Promise<any> {
  const r = await call(conn, "get_runtime_status");
  expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  return r.structuredContent;
}

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, ms = 60_000) {
  const end = Date.now() + scaled(ms);
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Loads the shared worker did itself (its log line per load), as opposed to answered ones. */
const workerLoads = (serve: ServeProc) =>
  serve
    .stderr()
    .split("\n")
    .filter((l) => /"msg": "model loaded"/.test(l)).length;

const embed = (conn: Conn, text: string) =>
  call(conn, "run_inference", { model: MINILM, texts: [text] });

describe("two replicas, one remote worker", { timeout: scaled(300_000) }, () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-replicas-fleet-"));
  let certs: Certs;
  let serve: ServeProc;
  let d: Deployment;
  let a: Conn;
  let b: Conn;

  beforeAll(async () => {
    certs = makeCerts(join(dir, "certs"));
    serve = await startServe(certs, ["--threads", "1"]);
    d = await startDeployment({
      replicas: 2,
      policy: {
        tokens: [{ id: "ops", token_sha256: sha256(token), scopes: SCOPES }],
        limits: { rate_limit: { per_principal_per_minute: 6000 } },
        approvals: { rules: [] },
      },
      config: {
        runtime: {
          python: join(ROOT, ".venv/bin/python"),
          catalog: join(ROOT, "runtime/catalog.builtin.json"),
          workers: [
            {
              name: "r0",
              connect: `127.0.0.1:${serve.port}`,
              tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey },
              token_file: certs.token,
            },
          ],
          restart_window_s: 600,
          max_restarts: 20,
        },
      },
    });
    a = await connectHttp(d.replicas[0]!.url, token);
    b = await connectHttp(d.replicas[1]!.url, token);
    for (const c of [a, b])
      await until("r0 ready", async () => (await status(c)).workers[0].state === "ready");
  }, scaled(300_000));

  afterAll(async () => {
    await a?.close().catch(() => {});
    await b?.close().catch(() => {});
    await d?.stop();
    await serve?.stop();
  });

  it("both replicas serve on the one worker at once and say they are one fleet, not shards", async () => {
    const [sa, sb] = [await status(a), await status(b)];
    for (const s of [sa, sb]) {
      expect(s.replica.shard).toBe(false);
      expect(s.replica.note).toMatch(/one fleet.*remote workers are shared/);
    }
    // The same worker process (one hello, replayed to each connection), serving both.
    expect(sa.workers[0].pid).toBe(sb.workers[0].pid);
    for (const s of [sa, sb])
      expect(s.workers[0].shared).toMatchObject({ control_planes: 2, max_control_planes: 8 });
    expect(serve.stderr()).not.toMatch(/refused a control plane/);
  });

  it("a model loaded through A runs through B without a load on B; B's load of it is answered, not repeated", async () => {
    const loaded = await call(a, "load_model", { model: MINILM });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    expect(workerLoads(serve)).toBe(1);
    // B's pool learned it from the relay (no status poll, no load): it routes to r0.
    await until("B to see the model on r0", async () =>
      (await status(b)).workers[0].models.includes(MINILM),
    );
    const r = await embed(b, "through B");
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    const again = await call(b, "load_model", { model: MINILM });
    expect(again.isError, JSON.stringify(again.content)).toBeFalsy();
    expect(again.structuredContent.already_loaded).toBe(true);
    expect(again.structuredContent.placement).toEqual([
      expect.objectContaining({
        worker: "r0",
        bytes_on_device: loaded.structuredContent.bytes_on_device,
      }),
    ]);
    expect(workerLoads(serve)).toBe(1);
    // Both replicas' status is the worker's own: the same loaded model, with its queue.
    const [sa, sb] = [await status(a), await status(b)];
    for (const s of [sa, sb]) {
      expect(s.loaded.map((m: any) => m.model)).toEqual([MINILM]);
      expect(s.loaded[0].queue_depth).toBeGreaterThanOrEqual(0);
      expect(s.workers[0].models).toEqual([MINILM]);
      expect(s.workers[0].lost_models).toEqual([]);
    }
    // A load with other args (another dtype) is still refused: it would replace the model.
    const other = await call(b, "load_model", { model: MINILM, dtype: "bfloat16" });
    expect(errorOf(other)?.code).toBe("model_already_loaded");
  });

  it("an unload through B is gone for A", async () => {
    const u = await call(b, "unload_model", { model: MINILM });
    expect(u.isError, JSON.stringify(u.content)).toBeFalsy();
    await until(
      "A to see the unload",
      async () => (await status(a)).workers[0].models.length === 0,
    );
    const r = await embed(a, "after the unload");
    expect(errorOf(r)?.code).toBe("model_not_loaded");
    expect((await status(a)).loaded).toEqual([]);
  });

  it("a replica killed mid-traffic leaves the other's calls working and the model loaded for its restart", async () => {
    const loaded = await call(b, "load_model", { model: MINILM });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    await until("A to see the load", async () =>
      (await status(a)).workers[0].models.includes(MINILM),
    );
    const pid = (await status(b)).workers[0].pid;
    let stop = false;
    const results: any[] = [];
    const loop = (async () => {
      for (let i = 0; !stop; i++) results.push(await embed(b, `b ${i}`));
    })();
    // A's calls are in flight on the shared worker when A dies.
    const aCalls = Array.from({ length: 4 }, (_, i) => embed(a, `a ${i}`).catch((e) => e));
    await until("B's calls to run", async () => results.length >= 2);
    const atKill = results.length;
    await a.close().catch(() => {});
    await d.replicas[0]!.kill9();
    await Promise.allSettled(aCalls);
    await until("B's calls after the kill", async () => results.length >= atKill + 8, 120_000);
    stop = true;
    await loop;
    for (const r of results) expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    // The worker lived on: same process, the model still there; A comes back and uses it unloaded.
    const sb = await status(b);
    expect(sb.workers[0].pid).toBe(pid);
    expect(sb.workers[0].models).toEqual([MINILM]);
    await d.replicas[0]!.start();
    a = await connectHttp(d.replicas[0]!.url, token);
    await until("A to find the model on the worker", async () =>
      (await status(a)).workers[0].models.includes(MINILM),
    );
    const r = await embed(a, "A again");
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    expect(workerLoads(serve)).toBe(2); // the first load and B's after the unload: no other
  });
});

// The streaming audit sink end to end: a real server streams its records to a real HTTP receiver
// on loopback, and `tpu-mcp audit verify-export` checks what the receiver got against
// `tpu-mcp audit head` (no key); with the receiver down, calls keep succeeding and the drops are
// counted (/metrics) and named by a gap line once it is back; a file sink rotates by size.
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";

/** A receiver of ndjson POSTs; `listen(port)` again after `close()` brings it back. */
function receiver() {
  const lines: string[] = [];
  let server: Server | undefined;
  return {
    lines,
    listen(port = 0) {
      return new Promise<number>((resolve) => {
        server = createServer(async (req, res) => {
          let raw = "";
          for await (const c of req) raw += c;
          lines.push(...raw.split("\n").filter((l) => l !== ""));
          res.writeHead(200).end();
        });
        server.listen(port, "127.0.0.1", () => resolve((server!.address() as AddressInfo).port));
      });
    },
    close: () =>
      new Promise<void>((r) => {
        if (!server) return r();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

async function until<T>(fn: () => T | undefined | false, what: string, ms = 30_000): Promise<T> {
  const end = Date.now() + scaled(ms);
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const T = { timeout: scaled(180_000) };

async function metric(server: HttpServerProc, name: string): Promise<number> {
  const text = await (await fetch(server.url.replace(/\/mcp$/, "/metrics"))).text();
  const m = new RegExp(`^${name} (\\d+)`, "m").exec(text);
  return m ? Number(m[1]) : NaN;
}

describe("streaming audit sink (HTTP)", () => {
  const rx = receiver();
  let port: number;
  let server: HttpServerProc;
  let config: string;
  let dir: string;
  beforeAll(async () => {
    port = await rx.listen();
    dir = mkdtempSync(join(tmpdir(), "tpu-mcp-sink-"));
    config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
          audit: {
            ...DEMO_POLICY.audit,
            sink: {
              kind: "http",
              url: `http://127.0.0.1:${port}/audit`,
              max_queue: 20,
              retry_base_ms: 100,
              max_backoff_s: 0.5,
            },
          },
        },
      },
      dir,
    );
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
    await rx.close();
  });

  it("delivers every record with its proof fields, verifiable without the key", T, async () => {
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    try {
      for (let i = 0; i < 10; i++) {
        const r = await agent.client.callTool({ name: "list_models", arguments: {} });
        expect(r.isError).toBeFalsy();
      }
      // A record another process appends (the CLI's decision) is read back into the stream.
      const args = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 0 };
      const asked = await agent.client.callTool({ name: "run_benchmark", arguments: args });
      const id = errorOf(asked)!.details.approval_id;
      const denied = await cli(config, "approvals", "deny", id, "--token", DEMO_TOKENS.operator);
      expect(denied.code, denied.stderr).toBe(0);
      await agent.client.callTool({ name: "list_models", arguments: {} });
    } finally {
      await agent.close();
    }
    const head = JSON.parse((await cli(config, "audit", "head")).stdout);
    await until(
      () => rx.lines.some((l) => JSON.parse(l).seq === head.seq),
      `record #${head.seq} at the receiver`,
    );
    const got = join(dir, "received.jsonl");
    writeFileSync(got, rx.lines.join("\n") + "\n");
    expect(rx.lines.every((l) => JSON.parse(l).type === "audit_record")).toBe(true);
    const received = rx.lines.map((l) => JSON.parse(l));
    expect(received.some((l) => l.record.outcome === "approval_denied")).toBe(true);
    const v = await cli(config, "audit", "verify-export", got, "--head", head.export_hash);
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout).toMatch(/^ok: records \d+\.\.\d+/);

    // One line edited: the receiver's check fails.
    const edited = rx.lines.map((l, i) => {
      if (i !== 3) return l;
      const o = JSON.parse(l);
      o.record.principal = "someone-else";
      return JSON.stringify(o);
    });
    writeFileSync(got, edited.join("\n") + "\n");
    const bad = await cli(config, "audit", "verify-export", got, "--head", head.export_hash);
    expect(bad.code).toBe(1);
  });

  it(
    "keeps calls succeeding while the receiver is down, counts the drops, names the gap",
    T,
    async () => {
      await rx.close();
      const before = rx.lines.length;
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      try {
        // Each call appends two records (allowed, executed): 60 calls overflow a queue of 20.
        for (let i = 0; i < 60; i++) {
          const r = await agent.client.callTool({ name: "list_models", arguments: {} });
          expect(r.isError).toBeFalsy();
        }
        const dropped = await until(
          async () => (await metric(server, "tpu_mcp_audit_sink_dropped_records")) || false,
          "dropped records in /metrics",
        );
        expect(dropped).toBeGreaterThanOrEqual(60 * 2 - 20 - 1);
        // Back up: what was queued arrives, then a gap line naming what was dropped.
        await rx.listen(port);
        const gap = await until(
          () => rx.lines.slice(before).find((l) => JSON.parse(l).type === "audit_gap"),
          "the gap line",
        );
        const g = JSON.parse(gap);
        expect(g.last_seq - g.first_seq + 1).toBe(g.dropped);
        expect(g.dropped).toBe(dropped);
        // The record after the gap follows it in the stream.
        await agent.client.callTool({ name: "list_models", arguments: {} });
        const next = await until(
          () => rx.lines.slice(rx.lines.indexOf(gap) + 1)[0],
          "a record after the gap",
        );
        expect(JSON.parse(next).seq).toBe(g.last_seq + 1);
      } finally {
        await agent.close();
      }
    },
  );
});

describe("streaming audit sink (file)", () => {
  it("rotates by size, and the files in order verify as one segment", T, async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-sink-file-"));
    const config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
          audit: {
            ...DEMO_POLICY.audit,
            sink: { kind: "file", path: "audit.jsonl", max_bytes: 8192, keep: 50 },
          },
        },
      },
      dir,
    );
    const server = await startHttpServer(config);
    try {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      try {
        for (let i = 0; i < 30; i++)
          await agent.client.callTool({ name: "list_models", arguments: {} });
      } finally {
        await agent.close();
      }
      const head = JSON.parse((await cli(config, "audit", "head")).stdout);
      const file = join(dir, "audit.jsonl");
      const all = () => {
        const parts: string[] = [];
        for (let i = 50; i >= 1; i--)
          if (existsSync(`${file}.${i}`)) parts.push(readFileSync(`${file}.${i}`, "utf8"));
        if (existsSync(file)) parts.push(readFileSync(file, "utf8"));
        return parts.join("");
      };
      await until(() => all().includes(`"seq":${head.seq},`), `record #${head.seq} in the files`);
      expect(existsSync(`${file}.2`)).toBe(true);
      for (let i = 1; existsSync(`${file}.${i}`); i++)
        expect(readFileSync(`${file}.${i}`).length).toBeLessThanOrEqual(8192);
      const joined = join(dir, "joined.jsonl");
      writeFileSync(joined, all());
      const v = await cli(config, "audit", "verify-export", joined, "--head", head.export_hash);
      expect(v.code, v.stdout + v.stderr).toBe(0);
    } finally {
      await server.stop();
    }
  });
});

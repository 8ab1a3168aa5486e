// Approval webhooks end to end: a real server (HTTP, real worker) notifies a receiver on
// loopback when an agent's call needs approval and when an operator decides it with the CLI (a
// separate process on the same SQLite file). Delivery is retried after a 500 and never holds up
// the tool call, even while the receiver keeps the request open.
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { verifyWebhook } from "../../policies/notify.js";
import {
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
  DEMO_POLICY,
  DEMO_TOKENS,
  cli,
} from "../helpers/server.js";

const SECRET = "whsec-test-0123456789abcdef";

interface Hit {
  headers: IncomingMessage["headers"];
  body: any;
  raw: string;
}

/** A receiver that answers 500 to the first POST, then 200; `hold` keeps answers back. */
function startReceiver() {
  const hits: Hit[] = [];
  let held: (() => void)[] | null = null;
  const arrived: (() => void)[] = [];
  const server: Server = createServer(async (req, res) => {
    let raw = "";
    for await (const c of req) raw += c;
    hits.push({ headers: req.headers, body: JSON.parse(raw), raw });
    arrived.splice(0).forEach((f) => f());
    const answer = () => res.writeHead(hits.length === 1 ? 500 : 200).end();
    if (held) held.push(answer);
    else answer();
  });
  return new Promise<{
    url: string;
    hits: Hit[];
    hold(): void;
    release(): void;
    next(): Promise<void>;
    close(): Promise<void>;
  }>((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/tpu`,
        hits,
        hold: () => {
          held = [];
        },
        release: () => {
          const h = held ?? [];
          held = null;
          h.forEach((f) => f());
        },
        next: () => new Promise<void>((r) => arrived.push(r)),
        close: () =>
          new Promise<void>((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      }),
    ),
  );
}

async function until<T>(fn: () => T | undefined | false, what: string, ms = 30_000): Promise<T> {
  const end = Date.now() + scaled(ms);
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("approval webhooks", () => {
  let rx: Awaited<ReturnType<typeof startReceiver>>;
  let server: HttpServerProc;
  let config: string;
  beforeAll(async () => {
    rx = await startReceiver();
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-notify-"));
    writeFileSync(join(dir, "webhook.secret"), SECRET + "\n", { mode: 0o600 });
    config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
          approvals: {
            ...DEMO_POLICY.approvals,
            notify: [{ url: rx.url, secret_file: "webhook.secret" }],
          },
        },
      },
      dir,
    );
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
    await rx?.close();
  });

  const verify = (h: Hit) =>
    verifyWebhook(
      SECRET,
      {
        timestamp: h.headers["x-tpu-mcp-timestamp"] as string,
        signature: h.headers["x-tpu-mcp-signature"] as string,
      },
      h.raw,
    );

  it("signs, retries after a 500, and reports a CLI decision", async () => {
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    try {
      const args = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 0 };
      const r = await agent.client.callTool({ name: "run_benchmark", arguments: args });
      expect(errorOf(r)?.code).toBe("approval_required");
      const id = errorOf(r)!.details.approval_id;

      // First POST answered 500, the retry 200: the same delivery, both signed.
      await until(() => rx.hits.length >= 2, "the retried webhook");
      const [first, retry] = rx.hits;
      expect(verify(first)).toEqual({ ok: true });
      expect(verify(retry)).toEqual({ ok: true });
      expect(retry.headers["x-tpu-mcp-delivery"]).toBe(first.headers["x-tpu-mcp-delivery"]);
      expect(retry.body.event).toBe("approval.requested");
      expect(retry.body.approval).toMatchObject({ id, principal: "agent", tool: "run_benchmark" });
      expect(retry.body.approval.args_preview).toMatchObject({ model: "mnist-cnn" });
      expect(retry.body.text).toMatch(
        new RegExp(`node /\\S+/bin/tpu-mcp\\.js approvals approve ${id} --config /\\S+\\.json`),
      );
      expect(retry.body.console_url).toMatch(/^http:\/\/localhost:\d+\/console\/$/);

      // A decision made by another process (the CLI) is noticed and sent too.
      const denied = await cli(
        config,
        "approvals",
        "deny",
        id,
        "--reason",
        "not today",
        "--token",
        DEMO_TOKENS.operator,
      );
      expect(denied.code, denied.stderr).toBe(0);
      const decided = await until(
        () => rx.hits.find((h) => h.body.event === "approval.denied"),
        "the decision webhook",
      );
      expect(verify(decided)).toEqual({ ok: true });
      expect(decided.body.approval).toMatchObject({ id, status: "denied", decided_by: "operator" });
      expect(decided.body.text).toContain("denied by operator: not today");

      const metrics = await (await fetch(server.url.replace(/\/mcp$/, "/metrics"))).text();
      expect(metrics).toMatch(/tpu_mcp_webhook_attempt_failures_total 1\b/);
      expect(metrics).toMatch(/tpu_mcp_webhook_deliveries_total\{outcome="delivered"\} 2\b/);
    } finally {
      await agent.close();
    }
  });

  it("does not hold the tool call while the receiver keeps the request open", async () => {
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    rx.hold();
    try {
      const before = rx.hits.length;
      const arrived = rx.next();
      const args = { model: "mnist-cnn", batch_sizes: [2], iterations: 2, warmup: 0 };
      const r = await agent.client.callTool({ name: "run_benchmark", arguments: args });
      expect(errorOf(r)?.code).toBe("approval_required");
      await arrived; // the receiver has the POST and has not answered it
      expect(rx.hits.length).toBe(before + 1);
      // More calls complete while that delivery is still open.
      const again = await agent.client.callTool({ name: "run_benchmark", arguments: args });
      expect(errorOf(again)?.details.approval_id).toBe(errorOf(r)!.details.approval_id);
      const status = await agent.client.callTool({ name: "list_models", arguments: {} });
      expect(status.isError).toBeFalsy();
    } finally {
      rx.release();
      await agent.close();
    }
  });

  it("refuses to start when a webhook's secret file is missing or too short", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-notify-bad-"));
    writeFileSync(join(dir, "short.secret"), "tiny\n");
    for (const [file, msg] of [
      ["missing.secret", /secret_file: cannot read .*missing\.secret \(ENOENT\)/],
      ["short.secret", /shorter than 16 bytes/],
    ] as const) {
      const cfg = writeConfig(
        {
          policy: {
            ...DEMO_POLICY,
            approvals: { ...DEMO_POLICY.approvals, notify: [{ url: rx.url, secret_file: file }] },
          },
        },
        dir,
      );
      await expect(startHttpServer(cfg)).rejects.toThrow(msg);
    }
  });
});

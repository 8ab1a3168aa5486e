// Webhook signing and delivery against a real HTTP receiver on loopback (no server, no worker).
import { createHmac } from "node:crypto";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { ApprovalRecord } from "../../policies/approval_record.js";
import {
  ApprovalNotifier,
  signWebhook,
  verifyWebhook,
  webhookText,
} from "../../policies/notify.js";

const SECRET = "0123456789abcdef0123456789abcdef";
const quiet = { info() {}, warn() {}, error() {} };

const record: ApprovalRecord = {
  id: "apr_" + "a".repeat(32),
  principal: "agent<script>",
  tool: "run_benchmark",
  args_digest: "d".repeat(64),
  args_preview: { model: "mnist-cnn", batch_sizes: [1, 2] },
  estimate: {
    device_seconds: 12,
    memory_bytes: 2 ** 30,
    weight_bytes: 2 ** 20,
    compile_s: 0,
  } as any,
  assurance: "token",
  status: "pending",
  created_at: "2026-11-30T10:00:00.000Z",
  expires_at: "2026-11-30T10:15:00.000Z",
  decided_by: null,
  decided_at: null,
  reason: null,
  used_at: null,
  policy_version: null,
  rule: null,
};

interface Hit {
  headers: IncomingMessage["headers"];
  body: string;
}

let servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  servers = [];
});

async function receiver(answer: (n: number) => number): Promise<{ url: string; hits: Hit[] }> {
  const hits: Hit[] = [];
  const s = createServer(async (req, res) => {
    let body = "";
    for await (const c of req) body += c;
    hits.push({ headers: req.headers, body });
    res.writeHead(answer(hits.length)).end();
  });
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/hook`, hits };
}

describe("webhook signature", () => {
  it("verifies its own signature and refuses a changed body, a wrong secret and a stale timestamp", () => {
    const ts = "1800000000";
    const body = JSON.stringify({ text: "x" });
    const sig = `v1=${signWebhook(SECRET, ts, body)}`;
    const now = { nowS: 1800000010 };
    expect(verifyWebhook(SECRET, { timestamp: ts, signature: sig }, body, now)).toEqual({
      ok: true,
    });
    expect(verifyWebhook(SECRET, { timestamp: ts, signature: sig }, body + " ", now).ok).toBe(
      false,
    );
    expect(
      verifyWebhook("another-secret-of-16+", { timestamp: ts, signature: sig }, body, now).ok,
    ).toBe(false);
    const stale = verifyWebhook(SECRET, { timestamp: ts, signature: sig }, body, {
      nowS: 1800000301,
    });
    expect(stale).toEqual({ ok: false, reason: "timestamp outside the replay window" });
    // The timestamp is signed: moving it forward breaks the signature.
    expect(verifyWebhook(SECRET, { timestamp: "1800000005", signature: sig }, body, now).ok).toBe(
      false,
    );
  });

  it("writes Slack-safe text naming the call, its estimate and how to approve", () => {
    const t = webhookText("approval.requested", record, "http://127.0.0.1:1/console/");
    expect(t).toContain("agent&lt;script&gt; wants to call `run_benchmark`");
    expect(t).toContain("~12 device-s, 1.0 GiB memory");
    expect(t).toContain(`node bin/tpu-mcp.js approvals approve ${record.id}`);
    // The link opens the console at this approval.
    expect(t).toContain(`<http://127.0.0.1:1/console/#/approvals/${record.id}|`);
  });

  it("says a passkey rule is decided in the console, and offers no CLI command for it", () => {
    const t = webhookText(
      "approval.requested",
      { ...record, assurance: "passkey" },
      "http://localhost:1/console/",
    );
    expect(t).toContain("Needs a passkey");
    expect(t).not.toContain("approvals approve");
    expect(t).toContain(`http://localhost:1/console/#/approvals/${record.id}`);
  });
});

// The documented wire format (README, policies/notify.ts), recomputed here with node:crypto alone
// so that a change of format on both the signer and the project's verifier still fails.
function independentSignature(secret: string, timestamp: string, rawBody: Buffer): string {
  const mac = createHmac("sha256", Buffer.from(secret, "utf8"));
  mac.update(Buffer.from(timestamp, "ascii"));
  mac.update(Buffer.from([0x2e])); // "."
  mac.update(rawBody);
  return "v1=" + mac.digest("hex");
}

describe("webhook wire format, checked without the project's verifier", () => {
  it("a delivered POST carries v1=HMAC-SHA256(secret, <timestamp>.<raw body>) in hex", async () => {
    const raw: Buffer[] = [];
    const headers: IncomingMessage["headers"][] = [];
    const s = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      raw.push(Buffer.concat(chunks));
      headers.push(req.headers);
      res.writeHead(204).end();
    });
    servers.push(s);
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(s.address() as AddressInfo).port}/hook`;
    const before = Math.floor(Date.now() / 1000);
    const n = new ApprovalNotifier({
      targets: [{ url, secret: Buffer.from(SECRET), events: ["requested"] }],
      logger: quiet,
      retryBaseMs: 20,
    });
    n.notify("created", record);
    await n.drain();
    expect(raw).toHaveLength(1);
    const ts = headers[0]!["x-tpu-mcp-timestamp"] as string;
    expect(ts).toMatch(/^\d+$/);
    expect(Math.abs(Number(ts) - before)).toBeLessThan(60); // unix seconds, not milliseconds
    expect(headers[0]!["x-tpu-mcp-signature"]).toBe(independentSignature(SECRET, ts, raw[0]!));
    expect(JSON.parse(raw[0]!.toString("utf8")).approval.id).toBe(record.id);
  });

  it("the project's verifier accepts exactly the documented format", () => {
    const body = Buffer.from(
      JSON.stringify({ event: "approval.requested", note: "caf\u00e9" }),
      "utf8",
    );
    const ts = "1800000000";
    const now = { nowS: 1_800_000_010 };
    const sig = independentSignature(SECRET, ts, body);
    expect(
      verifyWebhook(SECRET, { timestamp: ts, signature: sig }, body.toString("utf8"), now),
    ).toEqual({
      ok: true,
    });
    // The same MAC under another separator is not the format.
    const other = "v1=" + createHmac("sha256", SECRET).update(`${ts}:${body}`).digest("hex");
    expect(
      verifyWebhook(SECRET, { timestamp: ts, signature: other }, body.toString("utf8"), now).ok,
    ).toBe(false);
  });
});

describe("ApprovalNotifier", () => {
  it("signs each POST, retries after a 500 with the same delivery id, and reports the outcome", async () => {
    const rx = await receiver((n) => (n === 1 ? 500 : 204));
    const outcomes: string[] = [];
    let failedAttempts = 0;
    const n = new ApprovalNotifier({
      targets: [{ url: rx.url, secret: Buffer.from(SECRET), events: ["requested", "decided"] }],
      logger: quiet,
      retryBaseMs: 20,
      onOutcome: (o) => outcomes.push(o),
      onAttemptFailed: () => failedAttempts++,
    });
    n.notify("created", record);
    await n.drain();
    expect(rx.hits).toHaveLength(2);
    expect(outcomes).toEqual(["delivered"]);
    expect(failedAttempts).toBe(1);
    for (const hit of rx.hits) {
      const v = verifyWebhook(
        SECRET,
        {
          timestamp: hit.headers["x-tpu-mcp-timestamp"] as string,
          signature: hit.headers["x-tpu-mcp-signature"] as string,
        },
        hit.body,
      );
      expect(v).toEqual({ ok: true });
      const body = JSON.parse(hit.body);
      expect(body.event).toBe("approval.requested");
      expect(body.approval.id).toBe(record.id);
      expect(typeof body.text).toBe("string");
    }
    expect(rx.hits[0].headers["x-tpu-mcp-delivery"]).toBe(rx.hits[1].headers["x-tpu-mcp-delivery"]);
  });

  it("gives up at once on a 4xx, after max attempts on 5xx, and sends only the chosen events", async () => {
    const gone = await receiver(() => 410);
    const down = await receiver(() => 503);
    const decidedOnly = await receiver(() => 200);
    const outcomes: string[] = [];
    const n = new ApprovalNotifier({
      targets: [
        { url: gone.url, secret: Buffer.from(SECRET), events: ["requested"] },
        { url: down.url, secret: Buffer.from(SECRET), events: ["requested"] },
        { url: decidedOnly.url, secret: Buffer.from(SECRET), events: ["decided"] },
      ],
      logger: quiet,
      retryBaseMs: 5,
      maxAttempts: 3,
      onOutcome: (o) => outcomes.push(o),
    });
    n.notify("created", record);
    n.notify("decided", { ...record, status: "denied", decided_by: "operator", reason: "no" });
    n.notify("used", { ...record, status: "used" });
    await n.drain();
    expect(gone.hits).toHaveLength(1);
    expect(down.hits).toHaveLength(3);
    expect(decidedOnly.hits).toHaveLength(1);
    expect(JSON.parse(decidedOnly.hits[0].body).event).toBe("approval.denied");
    expect(JSON.parse(decidedOnly.hits[0].body).text).toContain("was denied by operator: no");
    expect(outcomes.sort()).toEqual(["delivered", "failed", "failed"]);
  });
});

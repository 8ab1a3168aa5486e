// Alerts end to end (issue 31, done-when): an agent making 1,000 refused calls in a minute is
// suspended by the default rule (no `alerts.rules` in the config); its next call is refused
// principal_suspended; one signed webhook arrives on a receiver on loopback; the CLI's
// `principals resume` (another process, the same policy.db) restores it; and all of it is in the
// audit trail.
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { auditRows } from "../helpers/audit_rows.js";
import { verifyWebhook } from "../../policies/notify.js";
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

const SECRET = "whsec-alerts-0123456789abcdef";

interface Hit {
  headers: IncomingMessage["headers"];
  body: any;
  raw: string;
}

function startReceiver() {
  const hits: Hit[] = [];
  const server: Server = createServer(async (req, res) => {
    let raw = "";
    for await (const c of req) raw += c;
    hits.push({ headers: req.headers, body: JSON.parse(raw), raw });
    res.writeHead(200).end();
  });
  return new Promise<{ url: string; hits: Hit[]; close(): Promise<void> }>((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/alerts`,
        hits,
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

describe("alerts: the default refusal-flood rule", () => {
  let rx: Awaited<ReturnType<typeof startReceiver>>;
  let server: HttpServerProc;
  let config: string;
  let dataDir: string;
  beforeAll(async () => {
    rx = await startReceiver();
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-alerts-"));
    dataDir = join(dir, "data");
    writeFileSync(join(dir, "alerts.secret"), SECRET + "\n", { mode: 0o600 });
    // The demo policy (120 calls/min) with an alert webhook; the rules are the defaults.
    config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          alerts: { notify: [{ url: rx.url, secret_file: "alerts.secret" }] },
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

  it(
    "suspends an agent after 1,000 refused calls, tells once, and resumes it by the CLI",
    { timeout: scaled(180_000) },
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      try {
        // Calls of a model that is not in the catalog: refused (unknown model, then rate_limited
        // once past 120 a minute), 50 at a time, until the rule suspends the agent. A loaded host
        // that makes fewer than 1,000 calls a minute needs more than 1,000 for the window to
        // hold 1,000 of them (the rule counts the last 60 s), so the loop does not stop at 1,000.
        const codes: string[] = [];
        const began = Date.now();
        for (let b = 0; b < 60 && !codes.includes("principal_suspended"); b++) {
          const batch = await Promise.all(
            Array.from({ length: 50 }, (_, i) =>
              agent.client.callTool({
                name: "run_inference",
                arguments: { model: `no-such-model-${b}-${i}`, texts: ["x"] },
              }),
            ),
          );
          codes.push(...batch.map((r) => errorOf(r)?.code ?? "ok"));
        }
        process.stderr.write(
          `[figure] alerts_refusal_flood: ${JSON.stringify({ calls: codes.length, s: (Date.now() - began) / 1000 })}\n`,
        );
        expect(codes, "never suspended: fewer than 1,000 refusals a minute?").toContain(
          "principal_suspended",
        );
        expect(codes.filter((c) => c === "ok")).toEqual([]);
        // The 1,000th refusal suspended it: later calls of the batch may already say so.
        expect(codes.slice(0, 999)).not.toContain("principal_suspended");

        // Its next call, a valid one, is refused with the reason and how it ends.
        const next = await agent.client.callTool({ name: "list_models", arguments: {} });
        const e = errorOf(next)!;
        expect(e.code).toBe("principal_suspended");
        expect(e.message).toMatch(
          /suspended since .* by the alert rule refusal-flood: 1000 refused calls within 60 s/,
        );
        expect(e.message).toContain("tpu-mcp principals resume agent");
        expect(e.details.until).toMatch(/^\d{4}-\d\d-\d\dT/);

        // One webhook, signed, for this alert; more refusals do not send another.
        await until(() => rx.hits.length >= 1, "the alert webhook");
        for (let i = 0; i < 20; i++)
          await agent.client.callTool({ name: "list_models", arguments: {} });
        const hit = rx.hits[0];
        expect(
          verifyWebhook(
            SECRET,
            {
              timestamp: hit.headers["x-tpu-mcp-timestamp"] as string,
              signature: hit.headers["x-tpu-mcp-signature"] as string,
            },
            hit.raw,
          ),
        ).toEqual({ ok: true });
        expect(hit.headers["x-tpu-mcp-event"]).toBe("alert.fired");
        expect(hit.body.alert).toMatchObject({
          rule: "refusal-flood",
          kind: "refusals",
          subject: "agent",
          principal: "agent",
          action: "suspend",
        });
        expect(hit.body.alert.details.refusals).toBe(1000);

        const metrics = await (await fetch(server.url.replace(/\/mcp$/, "/metrics"))).text();
        expect(metrics).toMatch(
          /tpu_mcp_alerts_fired_total\{rule="refusal-flood",action="suspend"\} 1\b/,
        );

        const listed = await cli(config, "principals", "suspended", "--json");
        expect(listed.code, listed.stderr).toBe(0);
        expect(JSON.parse(listed.stdout)).toMatchObject([
          { principal: "agent", rule: "refusal-flood" },
        ]);

        // The console shows the alert and the suspension to a signed-in operator.
        const base = server.url.replace(/\/mcp$/, "");
        const signIn = await fetch(`${base}/console/api/session`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ token: DEMO_TOKENS.operator }),
        });
        expect(signIn.status).toBe(200);
        const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0];
        const page = await (
          await fetch(`${base}/console/api/alerts`, { headers: { cookie } })
        ).json();
        expect(page.alerts).toMatchObject([{ rule: "refusal-flood", subject: "agent" }]);
        expect(page.suspended).toMatchObject([{ principal: "agent", rule: "refusal-flood" }]);

        // Resuming needs an operator's token; the agent's own is refused.
        const byAgent = await cli(
          config,
          "principals",
          "resume",
          "agent",
          "--token",
          DEMO_TOKENS.agent,
        );
        expect(byAgent.code).toBe(1);
        expect(byAgent.stderr).toContain("needs approvals:grant");
        const resumed = await cli(
          config,
          "principals",
          "resume",
          "agent",
          "--token",
          DEMO_TOKENS.operator,
        );
        expect(resumed.code, resumed.stderr).toBe(0);
        expect(resumed.stdout).toContain("resumed agent");
        const after = await agent.client.callTool({ name: "list_models", arguments: {} });
        expect(after.isError, JSON.stringify(errorOf(after))).toBeFalsy();
        expect(rx.hits.filter((h) => h.body.event === "alert.fired")).toHaveLength(1);

        // The trail: the alert, the suspension, the refusals it caused, the operator's resume.
        const rows = auditRows(dataDir);
        const alert = rows.filter((r) => r.outcome === "alert");
        expect(alert).toHaveLength(1);
        expect(alert[0]).toMatchObject({ principal: "agent", code: "refusals" });
        expect(alert[0].args).toMatchObject({ rule: "refusal-flood", refusals: 1000 });
        const suspended = rows.filter((r) => r.outcome === "suspended");
        expect(suspended).toHaveLength(1);
        expect(suspended[0]).toMatchObject({ principal: "agent", code: "principal_suspended" });
        const refused = rows.filter(
          (r) => r.code === "principal_suspended" && r.outcome === "denied",
        );
        expect(refused.length).toBeGreaterThanOrEqual(1);
        expect(refused[0].seq).toBeGreaterThan(suspended[0].seq);
        const resume = rows.filter((r) => r.outcome === "resumed");
        expect(resume).toHaveLength(1);
        expect(resume[0]).toMatchObject({ principal: "agent", approver: "operator" });
        expect(resume[0].seq).toBeGreaterThan(refused[0].seq);

        const verified = await cli(config, "audit", "verify");
        expect(verified.code, verified.stdout + verified.stderr).toBe(0);
      } finally {
        await agent.close();
      }
    },
  );
});

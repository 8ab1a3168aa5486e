// Issue 43, "from the anchors": the audit record of an approval decision carries `shown_sha256`,
// the SHA-256 of what the approver was shown. The test fetches the shown payload itself, as the
// CLI (`approvals show --json`) and the console's API give it, hashes its canonical JSON, and
// finds that hash on the decision's record. A real HTTP server, the operator CLI, the SDK client.
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { canonicalJson } from "../../policies/digest.js";
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
import { call } from "./scenario.js";

const sha256 = (shown: unknown) => createHash("sha256").update(canonicalJson(shown)).digest("hex");

interface Rec {
  outcome: string;
  approval_id?: string;
  approver?: string;
  shown_sha256?: string;
}

describe("a decision's audit record carries the hash of what the approver was shown", () => {
  let server: HttpServerProc;
  let config = "";
  let base = "";

  beforeAll(async () => {
    config = writeConfig({
      policy: {
        ...DEMO_POLICY,
        approvals: {
          ...DEMO_POLICY.approvals,
          rules: [{ tool: "load_model" }],
          elicitation: false,
        },
      },
    });
    server = await startHttpServer(config);
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => server?.stop());

  /** A new approval request of the agent's (load_model, arguments made distinct by `tag`). */
  async function requested(tag: string): Promise<string> {
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    try {
      const r = await call(agent.client, "load_model", { model: "mnist-cnn", dtype: tag });
      expect(errorOf(r)?.code, JSON.stringify(r)).toBe("approval_required");
      return errorOf(r)!.details.approval_id as string;
    } finally {
      await agent.close();
    }
  }

  async function decisionOf(id: string): Promise<Rec> {
    const r = await cli(config, "audit", "tail", "-n", "50", "--json");
    expect(r.code, r.stderr).toBe(0);
    const recs = (JSON.parse(r.stdout) as Rec[]).filter(
      (x) => x.approval_id === id && x.outcome.startsWith("approval_"),
    );
    const decided = recs.find(
      (x) => x.outcome === "approval_granted" || x.outcome === "approval_denied",
    );
    expect(decided, JSON.stringify(recs)).toBeDefined();
    return decided!;
  }

  it("decided with the CLI: the hash of `approvals show --json`'s shown payload", async () => {
    const id = await requested("float32");
    const show = await cli(config, "approvals", "show", id, "--json");
    expect(show.code, show.stderr).toBe(0);
    const listed = JSON.parse(show.stdout);
    expect(listed.shown).toMatchObject({
      approval_id: id,
      requested_by: "agent",
      tool: "load_model",
      args: { model: "mnist-cnn", dtype: "float32" },
      rule: expect.stringContaining("load_model"),
    });
    const ok = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
    expect(ok.code, ok.stderr).toBe(0);
    const rec = await decisionOf(id);
    expect(rec).toMatchObject({ outcome: "approval_granted", approver: "operator" });
    expect(rec.shown_sha256).toBe(sha256(listed.shown));
    // The text form shows the same hash next to the rule.
    const text = await cli(config, "approvals", "show", id);
    expect(text.stdout).toContain(`shown sha256: ${rec.shown_sha256}`);
  });

  it("decided in the console: the hash of the shown payload its API served the page", async () => {
    const id = await requested("bfloat16");
    const session = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: DEMO_TOKENS.operator }),
    });
    expect(session.status).toBe(200);
    const cookie = (session.headers.get("set-cookie") ?? "").split(";")[0]!;
    const { csrf } = (await session.json()) as { csrf: string };
    const page = await (
      await fetch(`${base}/console/api/approvals`, { headers: { cookie } })
    ).json();
    const item = page.pending.find((a: { id: string }) => a.id === id);
    expect(item.shown).toMatchObject({ approval_id: id, args: { dtype: "bfloat16" } });
    const host = new URL(base).host;
    const denied = await fetch(`${base}/console/api/approvals/${id}/deny`, {
      method: "POST",
      headers: {
        cookie,
        "x-csrf-token": csrf,
        origin: `http://${host}`,
        "sec-fetch-site": "same-origin",
        "content-type": "application/json",
      },
      body: JSON.stringify({ reason: "not now" }),
    });
    expect(denied.status, await denied.clone().text()).toBe(200);
    const rec = await decisionOf(id);
    expect(rec).toMatchObject({ outcome: "approval_denied", approver: "operator" });
    expect(rec.shown_sha256).toBe(sha256(item.shown));
    expect(item.shown_sha256).toBe(rec.shown_sha256);
  });
});

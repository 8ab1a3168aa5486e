// Issue 21's boundary, both halves together: a rule that requires a passkey, and the server running
// as its own OS user with a private (0700) data dir. The attacker is a process of another user —
// where the operator's coding agent runs — holding every token it could plausibly find (the
// agent's own, and an operator token with approvals:grant handed to it). It tries the CLI
// (approve, deny, enrol, remove), the server's files, the console API with a token session
// (approve, deny, add or approve a passkey, a guessed enrolment code) and forged WebAuthn
// assertions from a software authenticator that claims user verification: every way is refused
// with a clear error, and the server audits each attempt it saw; `tpu-mcp doctor`, run as that
// user, says the passkey rule holds there. Then the one way that works: the
// server's user prints an enrolment code, the operator enrols a passkey in chromium (the DevTools
// virtual authenticator, user verification on) and approves with it; audit verify re-checks it.
//
// In the browser suite rather than test/e2e: it needs chromium and the built console, which this
// suite's set-up provides (test/browser/setup.ts). Tests run as root here and in CI; elsewhere the
// file skips itself, saying why. The worker's Python may not be executable by the server's user
// (a venv under /root), so, as test/e2e/os_user.test.ts does, the rule gates a call that reaches
// the approval step without a worker (unload_model: no estimate); the test is about who can
// decide, and the agent's retry running after a passkey approval is passkeys.test.ts's.
import { rmSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  cliAs,
  deployFor,
  ensureUser,
  nodeAs,
  osUsersUnavailable,
  runAs,
  spawnAs,
  type OsUser,
} from "../helpers/os_user.js";
import {
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  ROOT,
  startHttpServer,
  type HttpServerProc,
} from "../helpers/server.js";
import { enrolAndSignIn, passkeyPage } from "./passkey_page.js";
import { chromiumPath } from "./setup.js";

const unavailable = osUsersUnavailable();
const title =
  "a passkey rule with the server as its own OS user" +
  (unavailable ? ` (skipped: ${unavailable})` : "");

type Json = Record<string, any>;

describe.skipIf(unavailable !== null)(title, () => {
  let server: OsUser;
  let attacker: OsUser;
  let srv: HttpServerProc;
  let dir: string;
  let state: string;
  let config: string;
  let base: string;
  let approvalId: string;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    server = ensureUser("tpumcp-test-srv");
    attacker = ensureUser("tpumcp-test-agent");
    ({ dir, state, config } = deployFor(server, "tpu-mcp-osuser-passkey-", {
      log_level: "warn",
      runtime: { start: "lazy", device: "cpu" },
      policy: {
        ...DEMO_POLICY,
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: {
          ...DEMO_POLICY.approvals,
          rules: [{ tool: "unload_model", principals: ["agent"], assurance: "passkey" }],
          elicitation: false,
        },
      },
    }));
    srv = await startHttpServer(config, [], spawnAs(server, state));
    // localhost: a secure context with a host name, where browsers allow passkeys.
    base = srv.url.replace(/\/mcp$/, "").replace("127.0.0.1", "localhost");
    browser = await chromium.launch({
      executablePath: chromiumPath(),
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    });
    page = (await passkeyPage(browser)).page;
  });

  afterAll(async () => {
    await browser?.close();
    await srv?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** The CLI as the server's user: the trust root, from the shell the deployment gives it. */
  const asServer = (...a: string[]) => cliAs(server, config, a, { home: state });
  const status = async (id: string) => {
    const r = await asServer("approvals", "show", id, "--json");
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout).status as string;
  };
  const passkeys = async () => {
    const r = await asServer("operators", "list", "--json");
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as Json[];
  };
  const auditTail = async () => {
    const r = await asServer("audit", "tail", "-n", "500", "--json");
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as Json[];
  };

  it("asks for a passkey approval, and names no CLI command to approve it", async () => {
    const agent = await connectHttp(srv.url, DEMO_TOKENS.agent);
    try {
      const r = await agent.client.callTool({
        name: "unload_model",
        arguments: { model: "mnist-cnn" },
      });
      const err = errorOf(r);
      expect(err?.code, JSON.stringify(r)).toBe("approval_required");
      expect(err!.details.assurance).toBe("passkey");
      expect(err!.details.approve_command).toBeUndefined();
      approvalId = err!.details.approval_id;
    } finally {
      await agent.close();
    }
  });

  it("refuses the agent's OS user every CLI command, with the operator's token, saying whose user decides", async () => {
    const refusal =
      /permission denied: the data dir .* belongs to another user[\s\S]*Run the command as the server's user/;
    const attempts = [
      ["approvals", "approve", approvalId, "--token", DEMO_TOKENS.operator],
      ["approvals", "deny", approvalId, "--token", DEMO_TOKENS.operator],
      ["operators", "enrol", "agent"],
      ["operators", "enrol", "operator"],
      ["operators", "remove", "operator"],
      ["approvals", "list"],
    ];
    for (const a of attempts) {
      const r = await cliAs(attacker, config, a);
      expect(r.code, a.join(" ")).toBe(1);
      expect(r.stderr, a.join(" ")).toMatch(refusal);
      expect(r.stdout, a.join(" ")).toBe("");
    }
    expect(await status(approvalId)).toBe("pending");
    expect(await passkeys()).toEqual([]);
  });

  it("refuses the agent's OS user the server's files: tokens, key, credential store", async () => {
    const db = join(state, "policy.db");
    const attempts = await nodeAs(
      attacker,
      `const fs = require("node:fs");
       const out = {};
       const tryIt = (name, fn) => { try { fn(); out[name] = "DONE"; } catch (e) { out[name] = e.code ?? String(e); } };
       tryIt("read_audit_key", () => fs.readFileSync(${JSON.stringify(join(state, "audit.key"))}));
       tryIt("open_store_rw", () => fs.closeSync(fs.openSync(${JSON.stringify(db)}, "r+")));
       tryIt("add_credential", () => {
         const Database = require("better-sqlite3");
         new Database(${JSON.stringify(db)}).prepare("INSERT INTO passkey_credentials (id, operator) VALUES ('x', 'agent')").run();
       });
       tryIt("new_file", () => fs.writeFileSync(${JSON.stringify(join(state, "policy.db.new"))}, "x"));
       console.log(JSON.stringify(out));`,
    );
    expect(attempts.code, attempts.stderr).toBe(0);
    const out = JSON.parse(attempts.stdout);
    expect(out).toMatchObject({
      read_audit_key: "EACCES",
      open_store_rw: "EACCES",
      new_file: "EACCES",
    });
    expect(out.add_credential).not.toBe("DONE");
    expect(await passkeys()).toEqual([]);
  });

  it("has the doctor say, run as the agent's user, that the passkey rule holds here", async () => {
    const r = await cliAs(attacker, config, ["doctor"]);
    expect(r.stdout).toMatch(/ok +data dir .* belongs to another user/);
    expect(r.stdout).toMatch(
      /ok +passkey rule\(s\) \(unload_model\): decided only in the console with an enrolled, user-verified passkey/,
    );
    // Run as the server's own user it cannot tell that user from an agent's: it warns, and says so.
    const own = await asServer("doctor");
    expect(own.stdout).toMatch(/warn passkey rule\(s\) \(unload_model\) are only as strong/);
  });

  it("enrols the operator's passkey with a code only the server's user can print, in the browser", async () => {
    const r = await asServer("operators", "enrol", "operator");
    expect(r.code, r.stderr).toBe(0);
    await enrolAndSignIn(page, base, /^\s+(\S+)$/m.exec(r.stdout)![1], "operator");
    expect(await passkeys()).toMatchObject([{ operator: "operator", status: "active" }]);
  });

  it("refuses the agent's OS user every console way, with every token it holds, and audits each", async () => {
    const [enrolled] = await passkeys();
    const script = join(ROOT, "test/helpers/console_attacker.mjs");
    const tokens = { agent: DEMO_TOKENS.agent, operator: DEMO_TOKENS.operator };
    const run = await runAs(attacker, process.execPath, [
      script,
      JSON.stringify({ base, tokens, approval: approvalId }),
    ]);
    expect(run.code, run.stderr).toBe(0);
    const r = JSON.parse(run.stdout) as Json;
    // The agent's own token opens no console session; the operator's token does, and decides nothing.
    expect(r.sign_in_agent).toMatchObject({ status: 403, code: "insufficient_scope" });
    expect(r.sign_in_operator.status).toBe(200);
    for (const k of ["approve", "deny"]) {
      expect(r[k], k).toMatchObject({ status: 403, code: "approval_needs_passkey" });
      // It names where to decide: the console on localhost, a secure context for passkeys.
      expect(r[k].message, k).toMatch(/operator console at http:\/\/localhost:\d+\/console\//);
    }
    // No passkey of its own: not from a token session, nor by a guessed enrolment code.
    expect(r.add_passkey).toMatchObject({ status: 403, code: "passkey_refused" });
    expect(r.add_passkey.message).toMatch(/sign in with a passkey first/);
    expect(r.approve_enrolment).toMatchObject({ status: 403, code: "passkey_refused" });
    expect(r.enrol_with_guessed_code).toMatchObject({ status: 403, code: "passkey_refused" });
    // A software authenticator's assertions: signed with its own key while claiming the
    // operator's enrolled credential, and with a credential of its own.
    expect(r.forged_as_operator_credential).toMatchObject({
      status: 403,
      code: "passkey_refused",
      claimed: enrolled.id,
    });
    expect(r.forged_as_operator_credential.message).toMatch(/signature does not verify/);
    expect(r.forged_own_credential).toMatchObject({ status: 403, code: "passkey_refused" });
    expect(r.forged_own_credential.message).toMatch(/not enrolled/);
    expect(r.sign_in_soft_passkey).toMatchObject({ status: 403, code: "passkey_refused" });

    expect(await status(approvalId)).toBe("pending");
    expect(await passkeys()).toMatchObject([{ id: enrolled.id, operator: "operator" }]);
    // The server saw each attempt, and its audit trail says so.
    const denied = (await auditTail()).filter((x) => x.outcome === "denied");
    const onApproval = denied.filter((x) => x.approval_id === approvalId);
    expect(onApproval.filter((x) => x.code === "approval_needs_passkey")).toHaveLength(2);
    expect(onApproval.filter((x) => x.code === "passkey_refused")).toHaveLength(2);
    const ceremonies = denied.filter((x) => x.tool === "passkeys").map((x) => x.reason);
    expect(ceremonies.join("\n")).toMatch(/passkeys\/add\/options: sign in with a passkey first/);
    // The guessed code and the soft passkey's sign-in come before any session: failed
    // authentications, reported by the limiter once per address (the last test reads them).
  });

  it("approves only through the ceremony: the operator's passkey signs, audit verify re-checks it", async () => {
    await page.goto(`${base}/console/#/approvals`);
    const card = page.locator(`article[data-id="${approvalId}"]`);
    await expect.poll(() => card.textContent()).toContain("a passkey");
    await card.locator("button.approve").click();
    await expect.poll(() => status(approvalId)).toBe("approved");
    const v = await asServer("audit", "verify");
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout).toMatch(/ok: 1 passkey-signed decision\(s\) verified/);
    const granted = (await auditTail()).find(
      (x) => x.approval_id === approvalId && x.outcome === "approval_granted",
    );
    expect(granted).toMatchObject({
      assurance: "passkey",
      approver: "operator",
      evidence: { credential_id: (await passkeys())[0].id },
    });
  });

  it("reports the refusals before a session (a guessed code, a soft passkey) as failed authentications", async () => {
    await srv.stop(); // the limiter's window is written at close at the latest
    const failed = (await auditTail()).filter((x) => x.tool === "authenticate");
    const surfaces = failed.flatMap((x) => x.args?.surfaces ?? []);
    expect(surfaces).toEqual(
      expect.arrayContaining([
        "/console/api/passkeys/enrol/options",
        "/console/api/passkeys/sign-in",
      ]),
    );
    expect(failed.every((x) => x.principal === "unauthenticated")).toBe(true);
  });
});

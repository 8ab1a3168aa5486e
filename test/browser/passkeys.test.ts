// Passkey approvals in chromium, with the DevTools protocol's virtual authenticator (user
// verification on) against a real server: enrol with the CLI's one-time code, sign in with the
// passkey, approve and deny signed decisions; and every refusal the design promises, one test
// each. The page runs on http://localhost (a secure context with a host name: WebAuthn refuses
// a bare IP as relying party).
//
// The refusals drive the console API from inside the page (window.__pk, an init script): that is
// what a hostile or broken client could send, with real assertions from the virtual authenticator.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser, type CDPSession, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqlitePasskeys } from "../../server/stores/passkeys/sqlite.js";
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
import { enrolAndSignIn, passkeyPage } from "./passkey_page.js";
import { chromiumPath } from "./setup.js";
import { scaled } from "../helpers/calibrate.js";

const { agent: AGENT, operator: OPERATOR } = DEMO_TOKENS;
const BENCH = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 1 };

type Json = Record<string, any>;

/** Installed in every page before its scripts: raw WebAuthn and console API calls for the tests. */
function pageHelpers() {
  const b64u = (buf: ArrayBuffer) =>
    btoa(String.fromCharCode(...new Uint8Array(buf)))
      .replace(/\+/g, "-")
      .replace(/\//g, "_")
      .replace(/=+$/, "");
  const bytes = (s: string) =>
    Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
  (window as any).__pk = {
    async api(path: string, body?: unknown) {
      const s = await (await fetch("/console/api/session")).json();
      const r = await fetch(`/console/api/${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-csrf-token": s.csrf ?? "" },
        body: JSON.stringify(body ?? {}),
      });
      return { status: r.status, body: await r.json() };
    },
    /** navigator.credentials.get for server options, optionally changed (a client's liberties). */
    async get(o: any, patch: any = {}) {
      const opts = { ...o, ...patch };
      const cred = (await navigator.credentials.get({
        publicKey: {
          challenge: bytes(opts.challenge),
          rpId: opts.rpId,
          // In the page (serialised there, no imports): the authenticator's own timeout.
          timeout: 30_000,
          userVerification: opts.userVerification,
          allowCredentials: (opts.allowCredentials ?? []).map((c: any) => ({
            type: "public-key",
            id: bytes(c.id),
          })),
        },
      })) as PublicKeyCredential;
      const r = cred.response as AuthenticatorAssertionResponse;
      return {
        id: cred.id,
        rawId: b64u(cred.rawId),
        type: "public-key",
        clientExtensionResults: {},
        response: {
          authenticatorData: b64u(r.authenticatorData),
          clientDataJSON: b64u(r.clientDataJSON),
          signature: b64u(r.signature),
          ...(r.userHandle ? { userHandle: b64u(r.userHandle) } : {}),
        },
      };
    },
  };
}

describe("passkey approvals in chromium", () => {
  let server: HttpServerProc;
  let config: string;
  let dataDir: string;
  let base: string;
  let browser: Browser;
  let page: Page;
  let cdp: CDPSession;
  let authenticatorId: string;
  let agent: Awaited<ReturnType<typeof connectHttp>>;
  let iterations = 2;
  /** The operator's credential id (base64url), once enrolled. */
  let operatorCredential = "";

  const newOperatorPage = () => passkeyPage(browser, pageHelpers);

  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-passkeys-"));
    dataDir = join(dir, "data");
    config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
          approvals: {
            ...DEMO_POLICY.approvals,
            rules: [{ tool: "run_benchmark", principals: ["agent"], assurance: "passkey" }],
          },
        },
      },
      dir,
    );
    server = await startHttpServer(config);
    base = server.url.replace(/\/mcp$/, "").replace("127.0.0.1", "localhost");
    browser = await chromium.launch({
      executablePath: chromiumPath(),
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    });
    ({ page, cdp, id: authenticatorId } = await newOperatorPage());
    agent = await connectHttp(server.url, AGENT);
  });

  afterAll(async () => {
    await agent?.close();
    await browser?.close();
    await server?.stop();
  });

  /** A new approval request by the agent (each with other arguments: a new request). */
  async function requestApproval(): Promise<{ id: string; args: Json; details: Json }> {
    const args = { ...BENCH, iterations: iterations++ };
    const r = await agent.client.callTool({ name: "run_benchmark", arguments: args });
    const err = errorOf(r);
    expect(err?.code).toBe("approval_required");
    return { id: err!.details.approval_id, args, details: err!.details };
  }

  const call = (path: string, body?: unknown): Promise<{ status: number; body: Json }> =>
    page.evaluate(([p, b]) => (window as any).__pk.api(p, b), [path, body] as const);

  /** Options from the server, an assertion from the authenticator (optionally with liberties). */
  async function assertion(optionsPath: string, patch: Json = {}) {
    const o = await call(optionsPath);
    expect(o.status, JSON.stringify(o.body)).toBe(200);
    const response = await page.evaluate(([opts, p]) => (window as any).__pk.get(opts, p), [
      o.body.options,
      patch,
    ] as const);
    return { nonce: o.body.nonce as string, response };
  }

  const status = async (id: string) =>
    JSON.parse((await cli(config, "approvals", "show", id, "--json")).stdout).status;

  async function enrolmentCode(name: string): Promise<string> {
    const r = await cli(config, "operators", "enrol", name);
    expect(r.code, r.stderr).toBe(0);
    return /^\s+(\S+)$/m.exec(r.stdout)![1];
  }

  it("enrols the first passkey with the CLI's one-time code, then signs in with it (no token)", async () => {
    await enrolAndSignIn(page, base, await enrolmentCode("operator"), "operator");
    const listed = JSON.parse((await cli(config, "operators", "list", "--json")).stdout);
    expect(listed).toMatchObject([{ operator: "operator", status: "active" }]);
    expect(listed[0].counter).toBeGreaterThan(0);
    operatorCredential = listed[0].id;
  });

  it("refuses an enrolment code used twice, and one that expired (clock injected)", async () => {
    const used = await enrolmentCode("twice");
    const first = await call("passkeys/enrol/options", { code: used });
    expect(first.status).toBe(200);
    // Consume it with a real registration through the page's own code path.
    await page.evaluate(async (code) => {
      const r = await (window as any).__pk.api("passkeys/enrol/options", { code });
      const o = r.body.options;
      const bytes = (s: string) =>
        Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
      const b64u = (buf: ArrayBuffer) =>
        btoa(String.fromCharCode(...new Uint8Array(buf)))
          .replace(/\+/g, "-")
          .replace(/\//g, "_")
          .replace(/=+$/, "");
      const cred = (await navigator.credentials.create({
        publicKey: {
          challenge: bytes(o.challenge),
          rp: o.rp,
          user: { id: bytes(o.user.id), name: o.user.name, displayName: o.user.displayName },
          pubKeyCredParams: o.pubKeyCredParams,
          authenticatorSelection: o.authenticatorSelection,
          attestation: "none",
        },
      })) as PublicKeyCredential;
      const a = cred.response as AuthenticatorAttestationResponse;
      return (window as any).__pk.api("passkeys/enrol", {
        code,
        nonce: r.body.nonce,
        response: {
          id: cred.id,
          rawId: b64u(cred.rawId),
          type: "public-key",
          clientExtensionResults: {},
          response: {
            clientDataJSON: b64u(a.clientDataJSON),
            attestationObject: b64u(a.attestationObject),
            transports: a.getTransports(),
          },
        },
      });
    }, used);
    const again = await call("passkeys/enrol/options", { code: used });
    expect(again.status).toBe(403);
    expect(again.body.error).toMatchObject({ code: "passkey_refused" });
    expect(again.body.error.message).toMatch(/already used/);

    // A code made an hour ago by a store whose clock is injected: long expired for the server.
    const store = new SqlitePasskeys(join(dataDir, "policy.db"), {
      clock: () => Date.now() - 3600_000,
    });
    const late = (await store.createEnrolmentCode("late", 600)).code;
    store.close();
    const expired = await call("passkeys/enrol/options", { code: late });
    expect(expired.status).toBe(403);
    expect(expired.body.error.message).toMatch(/expired/);
  });

  it("keeps a second operator's passkey waiting until an enrolled passkey approves it", async () => {
    const second = await newOperatorPage();
    try {
      const code = await enrolmentCode("second");
      await second.page.goto(`${base}/console/`);
      await second.page.click("#enrol summary");
      await second.page.fill("#enrol-code", code);
      await second.page.click("#enrol-button");
      await expect
        .poll(() => second.page.textContent("#signin-error"))
        .toContain("it works once an operator approves it");
      await second.page.click("#passkey-signin");
      await expect
        .poll(() => second.page.textContent("#signin-error"))
        .toMatch(/waiting for an approval/);
      // The first operator approves it, signing with their own passkey.
      await page.goto(`${base}/console/#/passkeys`);
      await page.click('tr:has-text("second") .approve-passkey');
      await expect.poll(() => page.textContent("#passkeys-status")).toContain("approved");
      await second.page.click("#passkey-signin");
      await second.page
        .waitForSelector("#signout", { timeout: scaled(10_000) })
        .catch(async (e) => {
          throw new Error(`${e}: ${await second.page.textContent("#signin-error")}`);
        });
      expect(await second.page.textContent("#who")).toContain("second · passkey");
    } finally {
      await second.ctx.close();
    }
  });

  it("approves with a passkey; the agent's retry runs; audit verify re-checks the signature", async () => {
    const { id, args, details } = await requestApproval();
    expect(details.assurance).toBe("passkey");
    await page.goto(`${base}/console/#/approvals`);
    const card = page.locator(`article[data-id="${id}"]`);
    await expect.poll(() => card.textContent()).toContain("a passkey");
    await card.locator("button.approve").click();
    // Decided, the card leaves the pending list for the history.
    await expect.poll(() => status(id)).toBe("approved");
    await expect.poll(() => card.count()).toBe(0);
    const ran = await agent.client.callTool({
      name: "run_benchmark",
      arguments: { ...args, approval_id: id },
    });
    expect(errorOf(ran)).toBeUndefined();
    const v = await cli(config, "audit", "verify");
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout).toMatch(/ok: 1 passkey-signed decision\(s\) verified/);
    const tail = JSON.parse((await cli(config, "audit", "tail", "-n", "50", "--json")).stdout);
    const rec = tail.find((r: Json) => r.approval_id === id && r.outcome === "approval_granted");
    expect(rec).toMatchObject({
      assurance: "passkey",
      approver: "operator",
      evidence: { binding: { approval_id: id, decision: "approve" } },
    });
  });

  it("denies with a passkey", async () => {
    const { id, args } = await requestApproval();
    await page.goto(`${base}/console/#/approvals/${id}`);
    const card = page.locator(`article[data-id="${id}"]`);
    await card.locator(`#reason-${id}`).fill("not this week");
    await card.locator("button.deny").click();
    await expect.poll(() => status(id)).toBe("denied");
    const retry = await agent.client.callTool({
      name: "run_benchmark",
      arguments: { ...args, approval_id: id },
    });
    expect(errorOf(retry)?.code).toBe("approval_denied");
  });

  it("refuses an assertion made for another approval", async () => {
    const a = await requestApproval();
    const b = await requestApproval();
    const signedForB = await assertion(`approvals/${b.id}/approve/options`);
    const r = await call(`approvals/${a.id}/approve`, signedForB);
    expect(r.status).toBe(403);
    expect(r.body.error.code).toBe("passkey_refused");
    expect(await status(a.id)).toBe("pending");
    expect(await status(b.id)).toBe("pending");
  });

  it("refuses a replayed assertion", async () => {
    const { id } = await requestApproval();
    const signed = await assertion(`approvals/${id}/deny/options`);
    expect((await call(`approvals/${id}/deny`, signed)).status).toBe(200);
    const replay = await call(`approvals/${id}/deny`, signed);
    expect(replay.status).toBe(403);
    expect(replay.body.error).toMatchObject({ code: "passkey_refused" });
    expect(replay.body.error.message).toMatch(/already used/);
    // The sign-in ceremony's nonces are single-use too.
    const login = await assertion("passkeys/sign-in/options", {
      allowCredentials: [{ id: operatorCredential }],
    });
    expect((await call("passkeys/sign-in", login)).status).toBe(200);
    expect((await call("passkeys/sign-in", login)).status).toBe(403);
  });

  it("refuses an assertion without user verification", async () => {
    const { id } = await requestApproval();
    await cdp.send("WebAuthn.setUserVerified", { authenticatorId, isUserVerified: false });
    try {
      // A client that asks the authenticator not to verify the user, whatever the server said.
      const signed = await assertion(`approvals/${id}/approve/options`, {
        userVerification: "discouraged",
      });
      const r = await call(`approvals/${id}/approve`, signed);
      expect(r.status).toBe(403);
      expect(r.body.error.code).toBe("passkey_refused");
      expect(r.body.error.message).toMatch(/user verification|user could not be verified/i);
    } finally {
      await cdp.send("WebAuthn.setUserVerified", { authenticatorId, isUserVerified: true });
    }
    expect(await status(id)).toBe("pending");
  });

  it("refuses a signature counter that goes back (a cloned authenticator)", async () => {
    const { id } = await requestApproval();
    const { credentials } = await cdp.send("WebAuthn.getCredentials", { authenticatorId });
    const mine = credentials.find(
      (c) => c.credentialId === Buffer.from(operatorCredential, "base64url").toString("base64"),
    )!;
    expect(mine.signCount).toBeGreaterThan(2);
    // The same key, with the counter of an older copy.
    await cdp.send("WebAuthn.removeCredential", {
      authenticatorId,
      credentialId: mine.credentialId,
    });
    await cdp.send("WebAuthn.addCredential", {
      authenticatorId,
      credential: { ...mine, signCount: 0 },
    });
    try {
      const signed = await assertion(`approvals/${id}/approve/options`);
      const r = await call(`approvals/${id}/approve`, signed);
      expect(r.status).toBe(403);
      expect(r.body.error.message).toMatch(/counter went back/);
      expect(await status(id)).toBe("pending");
    } finally {
      await cdp.send("WebAuthn.removeCredential", {
        authenticatorId,
        credentialId: mine.credentialId,
      });
      await cdp.send("WebAuthn.addCredential", {
        authenticatorId,
        credential: { ...mine, signCount: mine.signCount + 100 },
      });
    }
  });

  it("refuses a credential that was never enrolled", async () => {
    const { id } = await requestApproval();
    const key = generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey;
    const credentialId = randomBytes(16);
    await cdp.send("WebAuthn.addCredential", {
      authenticatorId,
      credential: {
        credentialId: credentialId.toString("base64"),
        isResidentCredential: false,
        rpId: "localhost",
        privateKey: key.export({ format: "der", type: "pkcs8" }).toString("base64"),
        signCount: 0,
      },
    });
    const signed = await assertion(`approvals/${id}/approve/options`, {
      allowCredentials: [{ id: credentialId.toString("base64url") }],
    });
    const r = await call(`approvals/${id}/approve`, signed);
    expect(r.status).toBe(403);
    expect(r.body.error.message).toMatch(/not enrolled/);
    expect(await status(id)).toBe("pending");
  });

  it("refuses a CLI approval where the rule requires a passkey, naming the console", async () => {
    const { id } = await requestApproval();
    const r = await cli(config, "approvals", "approve", id, "--token", OPERATOR);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("approval_needs_passkey");
    expect(r.stderr).toMatch(/operator console/);
    expect(await status(id)).toBe("pending");
  });

  it("an agent holding the operator's token approves neither by CLI nor through the console API", async () => {
    const { id } = await requestApproval();
    // The CLI, with the token it read from the operator's files.
    const byCli = await cli(config, "approvals", "approve", id, "--token", OPERATOR);
    expect(byCli.code).toBe(1);
    expect(byCli.stderr).toContain("approval_needs_passkey");
    // The console API, signed in with the same token (no browser, no authenticator).
    const origin = base;
    const signIn = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json", origin },
      body: JSON.stringify({ token: OPERATOR }),
    });
    expect(signIn.status).toBe(200);
    const cookie = signIn.headers.get("set-cookie")!.split(";")[0];
    const { csrf } = (await signIn.json()) as Json;
    const post = (path: string, body: unknown = {}) =>
      fetch(`${base}/console/api/${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", origin, cookie, "x-csrf-token": csrf },
        body: JSON.stringify(body),
      });
    const plain = await post(`approvals/${id}/approve`);
    expect(plain.status).toBe(403);
    expect(((await plain.json()) as Json).error.code).toBe("approval_needs_passkey");
    // Nor can it add a passkey of its own from a token session.
    const add = await post("passkeys/add/options");
    expect(add.status).toBe(403);
    // A made-up assertion is no better than none.
    const options = (await (await post(`approvals/${id}/approve/options`)).json()) as Json;
    const forged = await post(`approvals/${id}/approve`, {
      nonce: options.nonce,
      response: {
        id: options.options.allowCredentials[0].id,
        rawId: options.options.allowCredentials[0].id,
        type: "public-key",
        clientExtensionResults: {},
        response: {
          authenticatorData: randomBytes(37).toString("base64url"),
          clientDataJSON: Buffer.from(
            JSON.stringify({ type: "webauthn.get", challenge: options.options.challenge, origin }),
          ).toString("base64url"),
          signature: randomBytes(70).toString("base64url"),
        },
      },
    });
    expect(forged.status).toBe(403);
    expect(await status(id)).toBe("pending");
  });

  it("audit verify fails when a signed decision no longer matches the enrolled key", async () => {
    // Swap the operator's public key for the second operator's: the stored evidence no longer
    // verifies, though the audit chain is intact.
    const Database = (await import("better-sqlite3")).default;
    const db = new Database(join(dataDir, "policy.db"));
    const other = db
      .prepare("SELECT public_key FROM passkey_credentials WHERE operator = 'second'")
      .get() as { public_key: Buffer };
    db.prepare("UPDATE passkey_credentials SET public_key = ? WHERE operator = 'operator'").run(
      other.public_key,
    );
    db.close();
    const v = await cli(config, "audit", "verify");
    expect(v.code).toBe(1);
    expect(v.stdout).toMatch(/chain intact/);
    expect(v.stdout).toMatch(/SIGNATURE CHECK FAILED/);
  });
});

// The console's HTTP surface without a browser: headers, assets, session lifetime (a JWT caps
// it), sign-out, sign-in throttling, and refusals without a session. The clicking is in
// test/browser/console.test.ts.
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  startHttpServer,
  writeConfig,
  type HttpServerProc,
  DEMO_POLICY,
} from "../helpers/server.js";

describe("console HTTP surface", () => {
  let server: HttpServerProc;
  let base: string;
  let sign: (scope: string, exp: string) => Promise<string>;

  beforeAll(async () => {
    const { publicKey, privateKey } = await generateKeyPair("ES256");
    const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256" };
    sign = (scope, exp) =>
      new SignJWT({ scope })
        .setProtectedHeader({ alg: "ES256", kid: "k1" })
        .setIssuer("https://issuer.test")
        .setAudience("https://tpu-mcp.test/mcp")
        .setSubject("carol")
        .setIssuedAt()
        .setExpirationTime(exp)
        .sign(privateKey);
    const policy = {
      ...DEMO_POLICY,
      jwt: {
        issuer: "https://issuer.test",
        audience: "https://tpu-mcp.test/mcp",
        jwks: { keys: [jwk] },
      },
    };
    server = await startHttpServer(
      writeConfig({ policy, runtime: { device: "cpu", start: "lazy" } }),
    );
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  const signIn = (token: string, headers: Record<string, string> = {}) =>
    fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ token }),
    });
  const cookieOf = (r: Response) => (r.headers.get("set-cookie") ?? "").split(";")[0];

  it("serves the page and assets with a strict CSP and no inline script", async () => {
    const page = await fetch(`${base}/console/`);
    expect(page.status).toBe(200);
    const csp = page.headers.get("content-security-policy")!;
    expect(csp).toContain("script-src 'self';");
    expect(csp).not.toContain("unsafe-inline");
    expect(csp).toContain("frame-ancestors 'none'");
    const html = await page.text();
    expect(html).not.toMatch(/<script>|<script [^>]*>\s*[^<\s]|<style|style=/);
    const js = await fetch(`${base}/console/assets/app.js`);
    expect(js.headers.get("content-type")).toMatch(/^text\/javascript/);
    expect(js.headers.get("x-content-type-options")).toBe("nosniff");
    expect((await fetch(`${base}/console/assets/../../mcp`)).status).not.toBe(200);
    expect((await fetch(`${base}/console/assets/other.js`)).status).toBe(404);
  });

  it("answers every API call without a session with 401, and says signed_in: false on GET session", async () => {
    for (const path of ["approvals", "events", "audit", "jobs", "runtime", "benchmarks"]) {
      const r = await fetch(`${base}/console/api/${path}`);
      expect(r.status, path).toBe(401);
    }
    expect(await (await fetch(`${base}/console/api/session`)).json()).toEqual({ signed_in: false });
    const forged = await fetch(`${base}/console/api/approvals`, {
      headers: { cookie: "tpu_console=forged" },
    });
    expect(forged.status).toBe(401);
  });

  it("caps a session at its JWT's expiry, refuses a JWT without approvals:grant, and signs out", async () => {
    const reader = await signIn(await sign("models:read", "5m"));
    expect(reader.status).toBe(403);
    const r = await signIn(await sign("approvals:grant", "90s"));
    expect(r.status).toBe(200);
    const body = await r.json();
    expect(body.principal).toBe("jwt:carol");
    const left = Date.parse(body.expires_at) - Date.now();
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThanOrEqual(90_000);
    expect(r.headers.get("set-cookie")).toMatch(/HttpOnly; SameSite=Strict; Max-Age=(\d{1,2})\b/);
    const cookie = cookieOf(r);
    expect((await fetch(`${base}/console/api/approvals`, { headers: { cookie } })).status).toBe(
      200,
    );
    // Sign-out needs the CSRF token too; afterwards the cookie is worthless.
    const noCsrf = await fetch(`${base}/console/api/session`, {
      method: "DELETE",
      headers: { cookie },
    });
    expect(noCsrf.status).toBe(403);
    const out = await fetch(`${base}/console/api/session`, {
      method: "DELETE",
      headers: { cookie, "x-csrf-token": body.csrf },
    });
    expect(out.status).toBe(200);
    expect((await fetch(`${base}/console/api/approvals`, { headers: { cookie } })).status).toBe(
      401,
    );
  });

  // A cross-site form POST meets three independent layers; each must hold on its own. Every case
  // below breaks exactly one layer and lets the others pass, and asserts that layer's own answer.
  describe("each layer against a cross-site form, with the other layers passing", () => {
    let cookie = "";
    let csrf = "";
    let host = "";
    const target = () => `${base}/console/api/approvals/apr_${"0".repeat(32)}/approve`;
    const post = (
      over: {
        cookie?: string | null;
        origin?: string;
        site?: string;
        type?: string;
        csrf?: string | null;
      } = {},
    ) => {
      const h: Record<string, string> = {
        origin: over.origin ?? `http://${host}`,
        "sec-fetch-site": over.site ?? "same-origin",
        "content-type": over.type ?? "application/json",
      };
      if (over.cookie !== null) h.cookie = over.cookie ?? cookie;
      if (over.csrf !== null) h["x-csrf-token"] = over.csrf ?? csrf;
      return fetch(target(), { method: "POST", headers: h, body: "{}" });
    };

    beforeAll(async () => {
      host = new URL(base).host;
      const r = await signIn("demo-operator-token");
      expect(r.status).toBe(200);
      cookie = cookieOf(r);
      csrf = (await r.json()).csrf;
      // Layer 1's premise: the browser does not send this cookie on a cross-site request.
      expect(r.headers.get("set-cookie")).toMatch(/; SameSite=Strict/);
    });

    it("all layers passing: the request reaches the approvals (no such approval: 404)", async () => {
      const r = await post();
      expect(r.status).toBe(404);
      expect((await r.json()).error.code).toBe("approval_not_found");
    });

    it("session cookie absent (SameSite=Strict, cross-site): 401 signed_out", async () => {
      const r = await post({ cookie: null });
      expect(r.status).toBe(401);
      expect((await r.json()).error).toMatchObject({ code: "signed_out" });
    });

    it("foreign Origin (the HTTP layer, before the console): 403 Origin not allowed", async () => {
      const r = await post({ origin: "http://localhost:1" });
      expect(r.status).toBe(403);
      expect((await r.json()).error).toMatchObject({
        code: -32000,
        message: expect.stringMatching(/^Origin not allowed/),
      });
    });

    it("Sec-Fetch-Site cross-site (the console's own check): 403 csrf", async () => {
      const r = await post({ site: "cross-site" });
      expect(r.status).toBe(403);
      expect((await r.json()).error).toEqual({
        code: "csrf",
        message: "cross-site request refused (cross-site)",
      });
    });

    it("no CSRF token: 403 csrf", async () => {
      const r = await post({ csrf: null });
      expect(r.status).toBe(403);
      expect((await r.json()).error).toMatchObject({
        code: "csrf",
        message: expect.stringMatching(/CSRF token/),
      });
    });

    it("a form's content type (text/plain, what an HTML form can send): 415 bad_request", async () => {
      const r = await post({ type: "text/plain" });
      expect(r.status).toBe(415);
      expect((await r.json()).error).toMatchObject({ code: "bad_request" });
    });
  });

  it("refuses a foreign Origin, a cross-site fetch, form-encoded bodies, and throttles guessing", async () => {
    const foreign = await signIn("demo-operator-token", { origin: "https://evil.example" });
    expect(foreign.status).toBe(403);
    const crossSite = await signIn("demo-operator-token", { "sec-fetch-site": "cross-site" });
    expect(crossSite.status).toBe(403);
    const form = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: "token=demo-operator-token",
    });
    expect(form.status).toBe(415);
    const answers: Response[] = [];
    for (let i = 0; i < 11; i++) answers.push(await signIn(`wrong-${i}`));
    const codes = answers.map((r) => r.status);
    // 10 free failures per address (http.auth_limit; earlier tests here spent some), then
    // back-off: 429 with Retry-After.
    const first = codes.indexOf(429);
    expect(first).toBeGreaterThan(0);
    expect(codes.slice(0, first).every((c) => c === 401)).toBe(true);
    expect(codes.slice(first).every((c) => c === 429)).toBe(true);
    const wait = Number(answers[first].headers.get("retry-after"));
    expect(wait).toBeGreaterThanOrEqual(1);
    expect(wait).toBeLessThanOrEqual(15); // http.auth_limit.max_backoff_s
    // The right token is not locked out: it waits the back-off at most, then signs in.
    await new Promise((r) => setTimeout(r, wait * 1000));
    expect((await signIn("demo-operator-token")).status).toBe(200);
  });
});

// Behind a TLS proxy (an https http.resource_url) the cookie is Secure; an operator's sessions
// are capped (http.console_sessions_per_principal, 8 by default): signing in once more signs out
// that operator's least recently used session, never another operator's.
describe("console cookie and sessions behind an https public URL", () => {
  let server: HttpServerProc;
  let base: string;
  beforeAll(async () => {
    server = await startHttpServer(
      writeConfig({
        policy: DEMO_POLICY,
        http: { resource_url: "https://tpu-mcp.example/mcp" },
        runtime: { device: "cpu", start: "lazy" },
      }),
    );
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  const signIn = (token: string) =>
    fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token }),
    });
  const works = async (cookie: string) =>
    (await fetch(`${base}/console/api/approvals`, { headers: { cookie } })).status === 200;

  it("sets Secure (with HttpOnly, SameSite=Strict, Path=/console) when the public URL is https", async () => {
    const r = await signIn("demo-operator-token");
    expect(r.status).toBe(200);
    const attrs = (r.headers.get("set-cookie") ?? "").split(/;\s*/).slice(1);
    expect(attrs).toEqual(
      expect.arrayContaining(["Path=/console", "HttpOnly", "SameSite=Strict", "Secure"]),
    );
    // Signing out clears it with the same flags.
    const { csrf } = await r.json();
    const cookie = (r.headers.get("set-cookie") ?? "").split(";")[0];
    const out = await fetch(`${base}/console/api/session`, {
      method: "DELETE",
      headers: { cookie, "x-csrf-token": csrf },
    });
    expect(out.headers.get("set-cookie")).toMatch(/Max-Age=0; Secure$/);
  });

  it("keeps at most 8 sessions per operator: one more signs out the least recently used", async () => {
    const cookies: string[] = [];
    for (let i = 0; i < 10; i++) {
      const r = await signIn("demo-operator-token");
      expect(r.status).toBe(200);
      cookies.push((r.headers.get("set-cookie") ?? "").split(";")[0]);
    }
    const alive = [];
    for (const c of cookies) alive.push(await works(c));
    expect(alive).toEqual([false, false, true, true, true, true, true, true, true, true]);
    // Use the oldest survivor, then sign in once more: the next oldest goes instead.
    expect(await works(cookies[2])).toBe(true);
    const again = await signIn("demo-operator-token");
    expect(again.status).toBe(200);
    expect(await works(cookies[3])).toBe(false);
    expect(await works(cookies[2])).toBe(true);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(metrics).toMatch(/^tpu_mcp_console_sessions 8$/m);
  });
});

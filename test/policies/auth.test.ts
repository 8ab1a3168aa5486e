import { exportJWK, generateKeyPair, SignJWT, type JWK } from "jose";
import { beforeAll, describe, expect, it } from "vitest";
import { Authenticator, bearerToken } from "../../policies/auth.js";
import { hashToken, parsePolicyConfig } from "../../policies/config.js";
import { AuthError } from "../../policies/errors.js";
import { FakeClock } from "./helpers.js";
import { TOOL_POLICIES } from "../../tools/registry.js";

async function authErr(p: Promise<unknown>): Promise<AuthError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(AuthError);
    return e as AuthError;
  }
  throw new Error("expected an AuthError");
}

describe("static tokens", () => {
  const clock = new FakeClock(Date.parse("2025-06-01T00:00:00Z"));
  const auth = new Authenticator(
    parsePolicyConfig(
      {
        tokens: [
          {
            id: "agent",
            token_sha256: hashToken("right-token"),
            scopes: ["models:read", "inference:run"],
          },
          {
            id: "old",
            token_sha256: hashToken("old-token"),
            scopes: ["models:read"],
            expires_at: "2025-05-31T23:59:59Z",
          },
        ],
      },
      TOOL_POLICIES,
    ),
    { clock: clock.now },
  );

  it("recognises a configured token at once, and nothing else", () => {
    expect(auth.recognize("right-token")).toMatchObject({ id: "agent", via: "token" });
    expect(auth.recognize("wrong-token")).toBeNull();
  });

  it("maps the right token to its principal", async () => {
    await expect(auth.authenticate("right-token")).resolves.toEqual({
      id: "agent",
      scopes: ["models:read", "inference:run"],
      via: "token",
    });
  });

  it("refuses a wrong or missing token with 401 invalid_token", async () => {
    const e = await authErr(auth.authenticate("wrong-token"));
    expect(e).toMatchObject({ status: 401, code: "invalid_token" });
    expect(e.wwwAuthenticate()).toMatch(/^Bearer realm="tpu-mcp", error="invalid_token"/);
    expect((await authErr(auth.authenticate(undefined))).code).toBe("invalid_token");
  });

  it("refuses an expired token with token_expired", async () => {
    expect((await authErr(auth.authenticate("old-token"))).code).toBe("token_expired");
  });

  it("keeps static token ids out of the jwt: namespace (config refuses them)", () => {
    expect(() =>
      parsePolicyConfig(
        {
          tokens: [{ id: "jwt:alice", token_sha256: hashToken("t"), scopes: ["models:read"] }],
        },
        TOOL_POLICIES,
      ),
    ).toThrow(/jwt:/);
    expect(() =>
      parsePolicyConfig(
        {
          tokens: [{ id: "a\u0000", token_sha256: hashToken("t"), scopes: ["models:read"] }],
        },
        TOOL_POLICIES,
      ),
    ).toThrow(/control/);
  });

  it("gives stdio sessions the configured principal", () => {
    expect(auth.stdioPrincipal()).toMatchObject({ id: "local-user", via: "stdio" });
  });

  it("extracts bearer tokens from headers", () => {
    expect(bearerToken("Bearer abc.def")).toBe("abc.def");
    expect(bearerToken("bearer  xyz")).toBe("xyz");
    expect(bearerToken("Basic abc")).toBeUndefined();
    expect(bearerToken(undefined)).toBeUndefined();
  });
});

describe("JWT", () => {
  const clock = new FakeClock(Date.parse("2025-06-01T00:00:00Z"));
  const now = () => Math.floor(clock.ms / 1000);
  let key: CryptoKey;
  let otherKey: CryptoKey;
  let auth: Authenticator;

  beforeAll(async () => {
    const pair = await generateKeyPair("ES256", { extractable: true });
    key = pair.privateKey;
    otherKey = (await generateKeyPair("ES256")).privateKey;
    const jwk: JWK = { ...(await exportJWK(pair.publicKey)), kid: "k1", alg: "ES256", use: "sig" };
    auth = new Authenticator(
      parsePolicyConfig(
        {
          jwt: {
            issuer: "https://issuer.example",
            audience: "https://tpu-mcp.example/mcp",
            jwks: { keys: [jwk] },
          },
        },
        TOOL_POLICIES,
      ),
      { clock: clock.now },
    );
  });

  const sign = (
    over: { aud?: string; iss?: string; exp?: number; scope?: unknown; sub?: string } = {},
    k?: CryptoKey,
  ) =>
    new SignJWT({ scope: over.scope ?? "models:read inference:run bogus" })
      .setProtectedHeader({ alg: "ES256", kid: "k1" })
      .setSubject(over.sub ?? "alice")
      .setIssuer(over.iss ?? "https://issuer.example")
      .setAudience(over.aud ?? "https://tpu-mcp.example/mcp")
      .setIssuedAt(now() - 10)
      .setExpirationTime(over.exp ?? now() + 300)
      .sign(k ?? key);

  it("accepts a good token and keeps only known scopes", async () => {
    await expect(auth.authenticate(await sign())).resolves.toEqual({
      id: "jwt:alice",
      scopes: ["models:read", "inference:run"],
      via: "jwt",
    });
  });

  it("accepts the scope claim as an array", async () => {
    const p = await auth.authenticate(await sign({ scope: ["benchmark:run", "x"] }));
    expect(p.scopes).toEqual(["benchmark:run"]);
  });

  it("refuses a token for another audience with 401", async () => {
    const e = await authErr(
      auth.authenticate(await sign({ aud: "https://some-other-api.example" })),
    );
    expect(e).toMatchObject({ status: 401, code: "invalid_token" });
    expect(e.description).toMatch(/"aud"/);
  });

  it("refuses a token from another issuer", async () => {
    const e = await authErr(auth.authenticate(await sign({ iss: "https://evil.example" })));
    expect(e.code).toBe("invalid_token");
    expect(e.description).toMatch(/"iss"/);
  });

  it("refuses an expired token with token_expired", async () => {
    const e = await authErr(auth.authenticate(await sign({ exp: now() - 3600 })));
    expect(e.code).toBe("token_expired");
  });

  it("recognises a JWT it verified (no I/O, for the failed-auth limiter), only until its exp", async () => {
    const t = await sign({ exp: now() + 60 });
    expect(auth.recognize(t)).toBeNull(); // never verified: unknown
    await auth.authenticate(t);
    expect(auth.recognize(t)).toMatchObject({ id: "jwt:alice", via: "jwt" });
    // A token that differs in one character is not recognised.
    expect(auth.recognize(t.slice(0, -1) + (t.endsWith("A") ? "B" : "A"))).toBeNull();
    clock.advance(61_000);
    expect(auth.recognize(t)).toBeNull();
  });

  it("names its principal jwt:<sub>, apart from any static token id", async () => {
    expect((await auth.authenticate(await sign({ sub: "agent" }))).id).toBe("jwt:agent");
    expect((await auth.authenticate(await sign({ sub: "jwt:agent" }))).id).toBe("jwt:jwt:agent");
  });

  it("refuses a subject with control characters or over 256 characters", async () => {
    for (const sub of [
      "a\u0000",
      "\u001b[2K",
      "a\u0085b",
      "a\u2028b",
      "\u202eabc",
      "x".repeat(257),
    ]) {
      const e = await authErr(auth.authenticate(await sign({ sub })));
      expect(e.code, JSON.stringify(sub)).toBe("invalid_token");
      expect(e.description).toMatch(/subject/);
    }
    expect((await auth.authenticate(await sign({ sub: "é漢".repeat(128) }))).id).toMatch(/^jwt:/);
  });

  it("refuses a token signed by another key", async () => {
    const e = await authErr(auth.authenticate(await sign({}, otherKey)));
    expect(e.code).toBe("invalid_token");
  });
});

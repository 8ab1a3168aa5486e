// Bearer-token authentication: static tokens (stored as sha256, compared in constant time) and
// JWTs verified against a JWKS with audience = this server. A token minted for another audience
// is refused, never passed on: this server does not act on tokens meant for someone else.

import { UNPRINTABLE_CLASS } from "../lib/text.js";
import { createHash, timingSafeEqual } from "node:crypto";
import {
  createLocalJWKSet,
  createRemoteJWKSet,
  errors as joseErrors,
  jwtVerify,
  type JWTVerifyGetKey,
} from "jose";
import { systemClock, type Clock } from "./clock.js";
import type { PolicyConfig } from "./config.js";
import { AuthError } from "./errors.js";
import { parseScopes, type Principal } from "./scopes.js";

interface StaticEntry {
  id: string;
  hash: Buffer;
  scopes: Principal["scopes"];
  expiresMs: number | null;
}

/** The token from an `Authorization: Bearer ...` header, or undefined. */
export function bearerToken(header: string | undefined | null): string | undefined {
  const m = /^Bearer[ ]+([^\s]+)\s*$/i.exec(header ?? "");
  return m?.[1];
}

/**
 * JWT principals are named `jwt:<sub>`: a subject can never equal a static token's id (config
 * refuses ids starting with `jwt:`), so it never shares that principal's jobs, approvals,
 * sessions or budget. Rules and the console name them the same way.
 */
export const JWT_PRINCIPAL_PREFIX = "jwt:";
export const MAX_SUBJECT_LENGTH = 256;
// A subject is shown in logs, the audit trail, the console and the CLI, and must read as what it
// is there (lib/text.ts).
const UNPRINTABLE = new RegExp(`[${UNPRINTABLE_CLASS}]`);

/** The principal id for a JWT subject, or why the subject is refused. */
export function jwtPrincipalId(sub: unknown): { id: string } | { refused: string } {
  if (typeof sub !== "string" || sub.length === 0) return { refused: "token has no subject" };
  if (sub.length > MAX_SUBJECT_LENGTH)
    return { refused: `token subject is longer than ${MAX_SUBJECT_LENGTH} characters` };
  if (UNPRINTABLE.test(sub)) return { refused: "token subject holds control characters" };
  return { id: `${JWT_PRINCIPAL_PREFIX}${sub}` };
}

function looksLikeJwt(token: string): boolean {
  return /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token);
}

/** How long a verified JWT is known without verifying it again (never past its `exp`). */
const JWT_MEMORY_MS = 5 * 60_000;
const MAX_PROVEN_JWTS = 4096;

export class Authenticator {
  private readonly statics: StaticEntry[];
  /** sha256 of a JWT verified lately → its principal (recognize()). */
  private readonly provenJwts = new Map<string, { principal: Principal; untilMs: number }>();
  private readonly jwks: JWTVerifyGetKey | null;
  private readonly clock: Clock;

  constructor(
    private readonly config: PolicyConfig,
    opts: { clock?: Clock } = {},
  ) {
    this.clock = opts.clock ?? systemClock;
    this.statics = config.tokens.map((t) => ({
      id: t.id,
      hash: Buffer.from(t.token_sha256, "hex"),
      scopes: t.scopes,
      expiresMs: t.expires_at ? Date.parse(t.expires_at) : null,
    }));
    const j = config.jwt;
    // Built here, not at module scope; the remote set fetches lazily on first use and caches.
    this.jwks = !j
      ? null
      : j.jwks
        ? createLocalJWKSet(j.jwks as Parameters<typeof createLocalJWKSet>[0])
        : createRemoteJWKSet(new URL(j.jwks_url!));
  }

  /** The principal for stdio sessions: configured, not authenticated (the local user owns the pipe). */
  stdioPrincipal(): Principal {
    const p = this.config.stdio_principal;
    return { id: p.id, scopes: [...p.scopes], via: "stdio" };
  }

  /** Resolves a bearer token to a principal; rejects with AuthError (HTTP 401). */
  async authenticate(token: string | undefined): Promise<Principal> {
    if (!token) throw new AuthError("invalid_token", "missing bearer token");
    const known = this.recognize(token);
    if (known) return known;
    if (this.jwks && looksLikeJwt(token)) {
      const p = await this.verifyJwt(token);
      this.rememberJwt(token, p);
      return p;
    }
    throw new AuthError("invalid_token", "unknown token");
  }

  /**
   * The principal of a credential known without verifying anything: a static token (a hash
   * compared in constant time, no I/O) or a JWT this process verified in the last
   * JWT_MEMORY_MS and that has not expired. Null for anything else, which only `authenticate`
   * can tell (the failed-auth limiter rations that, never this). Throws AuthError for an
   * expired static token.
   */
  recognize(token: string): Principal | null {
    const fromStatic = this.matchStatic(token);
    if (fromStatic) return fromStatic;
    const key = createHash("sha256").update(token, "utf8").digest("base64url");
    const seen = this.provenJwts.get(key);
    if (!seen) return null;
    if (this.clock() >= seen.untilMs) {
      this.provenJwts.delete(key);
      return null;
    }
    return { ...seen.principal, scopes: [...seen.principal.scopes] };
  }

  private rememberJwt(token: string, principal: Principal): void {
    const exp = (() => {
      try {
        return Number(JSON.parse(Buffer.from(token.split(".")[1], "base64url").toString()).exp);
      } catch {
        return NaN;
      }
    })();
    const now = this.clock();
    const untilMs = Math.min(now + JWT_MEMORY_MS, Number.isFinite(exp) ? exp * 1000 : now);
    if (untilMs <= now) return;
    // Bounded: the oldest goes first (a Map iterates in insertion order).
    if (this.provenJwts.size >= MAX_PROVEN_JWTS)
      this.provenJwts.delete(this.provenJwts.keys().next().value!);
    const key = createHash("sha256").update(token, "utf8").digest("base64url");
    this.provenJwts.set(key, { principal, untilMs });
  }

  private matchStatic(token: string): Principal | null {
    const h = createHash("sha256").update(token, "utf8").digest();
    let hit: StaticEntry | null = null;
    // Compare against every entry, so timing does not tell which (or whether one) matched early.
    for (const e of this.statics) {
      if (timingSafeEqual(h, e.hash) && !hit) hit = e;
    }
    if (!hit) return null;
    if (hit.expiresMs !== null && this.clock() >= hit.expiresMs) {
      throw new AuthError("token_expired", "token expired");
    }
    return { id: hit.id, scopes: [...hit.scopes], via: "token" };
  }

  private async verifyJwt(token: string): Promise<Principal> {
    const j = this.config.jwt!;
    let payload;
    try {
      ({ payload } = await jwtVerify(token, this.jwks!, {
        issuer: j.issuer,
        audience: j.audience,
        clockTolerance: j.clock_tolerance_s,
        currentDate: new Date(this.clock()),
        requiredClaims: ["sub", "exp"],
      }));
    } catch (e) {
      if (e instanceof joseErrors.JWTExpired) throw new AuthError("token_expired", "token expired");
      if (e instanceof joseErrors.JWTClaimValidationFailed) {
        // Names the claim (aud, iss, nbf...) but never echoes the token's values.
        throw new AuthError("invalid_token", `token claim "${e.claim}" is not acceptable`);
      }
      if (e instanceof joseErrors.JOSEError)
        throw new AuthError("invalid_token", "token signature or format is invalid");
      throw e;
    }
    const who = jwtPrincipalId(payload.sub);
    if ("refused" in who) throw new AuthError("invalid_token", who.refused);
    return { id: who.id, scopes: parseScopes(payload[j.scope_claim]), via: "jwt" };
  }
}

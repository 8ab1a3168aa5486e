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

export class Authenticator {
  private readonly statics: StaticEntry[];
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
    const fromStatic = this.matchStatic(token);
    if (fromStatic) return fromStatic;
    if (this.jwks && looksLikeJwt(token)) return this.verifyJwt(token);
    throw new AuthError("invalid_token", "unknown token");
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

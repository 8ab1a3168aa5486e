// The console's passkey API (WebAuthn ceremonies; the checks are policies/passkeys/'s):
//   POST passkeys/enrol/options {code}            first passkey of an operator, by the one-time
//   POST passkeys/enrol {code, nonce, response}     code `tpu-mcp operators enrol NAME` printed
//   POST passkeys/sign-in/options                  sign in with any enrolled passkey
//   POST passkeys/sign-in {nonce, response}
//   GET  passkeys                                  the operators' passkeys (signed in)
//   POST passkeys/add/options, passkeys/add        another device, from a passkey session; it
//                                                  waits until an existing passkey approves it
//   POST passkeys/ID/approve/options, …/approve    that approval, signed
//   POST approvals/ID/(approve|deny)/options       a decision's challenge, bound to the call
// The decision itself is POST approvals/ID/(approve|deny) with {nonce, response} (console.ts).
// Every write is same-origin with the session's CSRF token, as the rest of the console.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { TLSSocket } from "node:tls";
import type { Logger } from "pino";
import { refused, type Decision } from "../../policies/passkeys/binding.js";
import type { PasskeyCeremonies, Site } from "../../policies/passkeys/ceremony.js";
import type { DecisionEvidence } from "../../policies/passkeys/evidence.js";
import type { Passkeys, StoredCredential } from "../../policies/passkeys/store.js";
import { httpStatusOf, isPolicyError } from "../../policies/errors.js";
import { hasScope, parseScopes, type Principal } from "../../policies/scopes.js";
import type { App } from "../app/app.js";
import { HttpError } from "../http_util.js";

/** What the console's session code lends this module. */
export interface PasskeyRouteDeps {
  app: App;
  ceremonies: PasskeyCeremonies;
  store: Passkeys;
  log: Logger;
  publicHttps: boolean;
  readJson(req: IncomingMessage): Promise<any>;
  send(res: ServerResponse, status: number, body: unknown): void;
  /**
   * Counts a refusal before any session (a wrong enrolment code, a refused sign-in assertion) as
   * one failed authentication of the request's address: the failed-auth limiter reports those
   * once per address and window instead of one audit record each. Says how long the address now
   * waits when the failure put it into back-off.
   */
  failedAuth(req: IncomingMessage, surface: string): { retryAfterS: number } | null;
  /** Before such a check is evaluated: the limiter's refusal while the address is in back-off. */
  authBackoff(req: IncomingMessage, surface: string): { retryAfterS: number; why: string } | null;
  /** Opens a console session for a principal proven by a passkey (sets the cookie, answers). */
  openSession(
    req: IncomingMessage,
    res: ServerResponse,
    principal: Principal,
    credentialId: string,
  ): Promise<void>;
}

/** The routes whose refusal before a session is a failed authentication (the limiter's). */
const BEFORE_SESSION = new Set(["passkeys/enrol/options", "passkeys/enrol", "passkeys/sign-in"]);

/** The part of a console session these routes read. */
export interface PasskeySessionView {
  id: string;
  principal: Principal;
  /** The credential the session was opened with (passkey sessions only). */
  credential?: string;
}

/** A refusal of the ceremony: the code's status (404, 403, ...) and a log line saying why. */
function asHttp(e: unknown, log: Logger, what: string): never {
  if (isPolicyError(e)) {
    log.warn({ code: e.code, reason: e.message }, `${what} refused`);
    throw new HttpError(httpStatusOf(e.code), e.message, { code: e.code });
  }
  throw e;
}

export function credentialView(c: StoredCredential) {
  return {
    id: c.id,
    operator: c.operator,
    status: c.status,
    aaguid: c.aaguid,
    enrolled_by: c.enrolled_by,
    created_at: c.created_at,
    last_used_at: c.last_used_at,
  };
}

export function passkeyRoutes(d: PasskeyRouteDeps) {
  const { app, ceremonies, store, log } = d;

  /**
   * The origin the page runs on and its host name (the RP ID). The public URL when configured
   * (behind a proxy the request's own scheme is not the browser's); else the Host header, which
   * the HTTP layer already checked against the allowed hosts.
   */
  function site(req: IncomingMessage): Site {
    const pub = app.config.http.resource_url;
    if (pub) {
      const u = new URL(pub);
      return { origin: u.origin, rpId: u.hostname };
    }
    const host = req.headers.host ?? "";
    const tls = d.publicHttps || (req.socket as TLSSocket).encrypted === true;
    const u = new URL(`${tls ? "https" : "http"}://${host}`);
    return { origin: u.origin, rpId: u.hostname.replace(/^\[|\]$/g, "") };
  }

  /** The scopes a passkey operator signs in with: its configured token's, else approvals:grant. */
  function operatorPrincipal(operator: string): Principal {
    const t = app.config.policy.tokens.find((x) => x.id === operator);
    const scopes = t ? parseScopes(t.scopes) : parseScopes(["approvals:grant"]);
    return { id: operator, scopes, via: "passkey" };
  }

  const code = (body: any): string => {
    const c = typeof body?.code === "string" ? body.code.trim() : "";
    if (!c) throw new HttpError(400, "paste the enrolment code", { code: "bad_request" });
    return c;
  };

  // A policy refusal, not a bare 403: a token session trying to add or approve a passkey is
  // what an agent holding an operator's token would do, so the audit records it.
  function needPasskeySession(s: PasskeySessionView | null): PasskeySessionView {
    if (!s?.credential)
      throw refused(
        "sign in with a passkey first: only a passkey can add or approve another passkey, not a token",
      );
    return s;
  }

  async function pendingCredential(id: string): Promise<StoredCredential> {
    const c = await store.get(id);
    if (!c || c.status !== "pending")
      throw new HttpError(404, "no passkey enrolment waits under this id", { code: "not_found" });
    return c;
  }

  function audit(principal: string, outcome: "allowed" | "denied", reason: string) {
    return app.audit.append({
      time: new Date().toISOString(),
      principal,
      tool: "passkeys",
      args_digest: null,
      outcome,
      reason,
    });
  }

  /** Handles a passkey route; false when `api` is not one. */
  async function route(
    req: IncomingMessage,
    res: ServerResponse,
    api: string,
    method: string,
    s: PasskeySessionView | null,
  ): Promise<boolean> {
    if (method === "GET" && api === "passkeys") {
      if (!s) return false;
      d.send(res, 200, {
        passkeys: (await store.list()).map(credentialView),
        me: s.principal.id,
        signed_with_passkey: Boolean(s.credential),
      });
      return true;
    }
    if (method !== "POST") return false;
    // A check before any session is a failed authentication when refused: while the address is
    // in back-off it is refused before it is evaluated (nothing read, checked or charged).
    if (!s && BEFORE_SESSION.has(api)) {
      const wait = d.authBackoff(req, `/console/api/${api}`);
      if (wait)
        throw new HttpError(429, `${wait.why}: retry after ${wait.retryAfterS} s.`, {
          code: "rate_limited",
          headers: { "retry-after": String(wait.retryAfterS) },
          counted: true,
        });
    }
    try {
      if (api === "passkeys/enrol/options") {
        const c = code(await d.readJson(req));
        d.send(res, 200, await ceremonies.registrationOptions(`code:${c}`, site(req), { code: c }));
        return true;
      }
      if (api === "passkeys/enrol") {
        const body = await d.readJson(req);
        const c = code(body);
        const cred = await ceremonies.register(
          `code:${c}`,
          site(req),
          body?.nonce,
          body?.response,
          {
            code: c,
          },
        );
        await audit(
          cred.operator,
          "allowed",
          cred.status === "active"
            ? `passkey ${cred.id} enrolled with a one-time code (the first passkey)`
            : `passkey ${cred.id} enrolled with a one-time code; waits for an approval by an existing passkey`,
        );
        log.info({ operator: cred.operator, status: cred.status }, "passkey enrolled");
        d.send(res, 200, { passkey: credentialView(cred) });
        return true;
      }
      if (api === "passkeys/sign-in/options") {
        d.send(res, 200, await ceremonies.signInOptions(site(req)));
        return true;
      }
      if (api === "passkeys/sign-in") {
        const body = await d.readJson(req);
        const a = await ceremonies.signIn(site(req), body?.nonce, body?.response);
        const principal = operatorPrincipal(a.operator);
        if (!hasScope(principal, "approvals:grant"))
          throw new HttpError(
            403,
            `${principal.id} holds neither approvals:grant nor admin; the console is for operators`,
            { code: "insufficient_scope" },
          );
        await d.openSession(req, res, principal, a.credential.id);
        return true;
      }
      if (!s) return false;
      if (api === "passkeys/add/options") {
        const me = needPasskeySession(s);
        d.send(
          res,
          200,
          await ceremonies.registrationOptions(me.id, site(req), { operator: me.principal.id }),
        );
        return true;
      }
      if (api === "passkeys/add") {
        const me = needPasskeySession(s);
        const body = await d.readJson(req);
        const cred = await ceremonies.register(me.id, site(req), body?.nonce, body?.response, {
          operator: me.principal.id,
        });
        await audit(me.principal.id, "allowed", `passkey ${cred.id} added; waits for an approval`);
        d.send(res, 200, { passkey: credentialView(cred) });
        return true;
      }
      const p = /^passkeys\/([A-Za-z0-9_-]{16,1400})\/approve(\/options)?$/.exec(api);
      if (p) {
        const me = needPasskeySession(s);
        const pending = await pendingCredential(p[1]);
        if (p[2]) {
          d.send(
            res,
            200,
            await ceremonies.enrolmentOptions(me.id, site(req), pending, me.principal.id),
          );
          return true;
        }
        const body = await d.readJson(req);
        const { approver, credential } = await ceremonies.approveEnrolment(
          me.id,
          site(req),
          body?.nonce,
          body?.response,
          pending,
        );
        await audit(
          approver.operator,
          "allowed",
          `passkey ${credential.id} of ${credential.operator} approved with passkey ${approver.credential.id}`,
        );
        d.send(res, 200, { passkey: credentialView(credential) });
        return true;
      }
      const a = /^approvals\/(apr_[0-9a-f]{32})\/(approve|deny)\/options$/.exec(api);
      if (a) {
        const rec = await app.approvals.get(a[1]);
        if (!rec) throw new HttpError(404, `no approval ${a[1]}`, { code: "approval_not_found" });
        d.send(
          res,
          200,
          await ceremonies.decisionOptions(s.id, site(req), rec, a[2] as Decision, s.principal.id),
        );
        return true;
      }
    } catch (e) {
      if (!isPolicyError(e)) throw e;
      // Before a session nobody is known: a refusal is a failed authentication (a wrong code is
      // a guess), counted and reported by the limiter, never one audit record per request.
      // The limiter logs it too, once per address and window: no line per request here.
      if (!s) {
        log.debug({ code: e.code, reason: e.message }, `passkey ${api} refused`);
        const wait = d.failedAuth(req, `/console/api/${api}`);
        if (wait)
          throw new HttpError(
            429,
            `${e.message} Too many failed authentications from this address: retry after ${wait.retryAfterS} s.`,
            {
              code: "rate_limited",
              headers: { "retry-after": String(wait.retryAfterS) },
              counted: true,
            },
          );
        throw new HttpError(httpStatusOf(e.code), e.message, { code: e.code, counted: true });
      }
      await audit(s.principal.id, "denied", `passkey ${api}: ${e.message}`);
      asHttp(e, log, `passkey ${api}`);
    }
    return false;
  }

  /** A decision's assertion, verified against the approval as stored (null: no assertion sent). */
  async function decisionEvidence(
    req: IncomingMessage,
    s: PasskeySessionView,
    id: string,
    decision: Decision,
    body: any,
  ): Promise<DecisionEvidence | null> {
    if (body?.response === undefined) return null;
    const rec = await app.approvals.get(id);
    if (!rec) throw new HttpError(404, `no approval ${id}`, { code: "approval_not_found" });
    try {
      return await ceremonies.verifyDecision(
        s.id,
        site(req),
        body.nonce,
        body.response,
        rec,
        decision,
      );
    } catch (e) {
      if (isPolicyError(e))
        await app.audit.append({
          time: new Date().toISOString(),
          principal: s.principal.id,
          tool: rec.tool,
          args_digest: rec.args_digest,
          approval_id: id,
          outcome: "denied",
          code: e.code,
          reason: e.message,
        });
      return asHttp(e, log, "passkey decision");
    }
  }

  return { route, decisionEvidence };
}

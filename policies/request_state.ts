// The `requestState` of the 2026-07-28 era's in-band approval: the client echoes it back on the
// retry that carries the user's answer, so it is attacker-controlled. It is sealed with an HMAC
// (a key derived from the audit key: every process that shares the data dir verifies what another
// minted, and a restart keeps it valid) and bound to the principal, the tool, the argument digest
// and the approval it answers. Single use comes from the approval itself: answering decides it,
// and a decided approval cannot be decided again (the durable consumed-nonce store).

import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { Clock } from "./clock.js";
import { systemClock } from "./clock.js";

export interface ApprovalState {
  /** Principal id the state was minted for. */
  p: string;
  /** Tool name. */
  t: string;
  /** Argument digest (policies/digest.ts argsDigest). */
  d: string;
  /** The approval record this round asks about. */
  a: string;
  /** Random nonce: two states for one approval never look alike. */
  n: string;
  /** Expiry, epoch ms. */
  e: number;
}

/** Why a state was refused, for the caller's message and the audit record. */
export type StateRefusal = "malformed" | "mac" | "expired";

export class RequestStateError extends Error {
  constructor(readonly why: StateRefusal) {
    super(why);
    this.name = "RequestStateError";
  }
}

const VERSION = "v1";

export class RequestStateSealer {
  private readonly key: Buffer;

  /** `secret` is the audit key; the sealing key is derived from it, never the key itself. */
  constructor(
    secret: Buffer,
    private readonly clock: Clock = systemClock,
  ) {
    this.key = createHmac("sha256", secret).update("tpu-mcp request-state v1").digest();
  }

  seal(state: Omit<ApprovalState, "n" | "e">, ttlMs: number): string {
    const full: ApprovalState = {
      ...state,
      n: randomBytes(12).toString("base64url"),
      e: this.clock() + ttlMs,
    };
    const body = Buffer.from(JSON.stringify(full), "utf8").toString("base64url");
    return `${VERSION}.${body}.${this.mac(body)}`;
  }

  /** The state's payload, or a RequestStateError saying why it is refused. */
  open(wire: unknown): ApprovalState {
    if (typeof wire !== "string" || wire.length > 4096) throw new RequestStateError("malformed");
    const [version, body, mac, extra] = wire.split(".");
    if (version !== VERSION || !body || !mac || extra !== undefined)
      throw new RequestStateError("malformed");
    const want = Buffer.from(this.mac(body), "utf8");
    const got = Buffer.from(mac, "utf8");
    if (want.length !== got.length || !timingSafeEqual(want, got))
      throw new RequestStateError("mac");
    let s: ApprovalState;
    try {
      s = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
    } catch {
      throw new RequestStateError("malformed");
    }
    const fields = ["p", "t", "d", "a", "n"] as const;
    if (!s || typeof s !== "object" || fields.some((f) => typeof s[f] !== "string"))
      throw new RequestStateError("malformed");
    if (typeof s.e !== "number" || s.e <= this.clock()) throw new RequestStateError("expired");
    return s;
  }

  private mac(body: string): string {
    return createHmac("sha256", this.key).update(`${VERSION}.${body}`).digest("base64url");
  }
}

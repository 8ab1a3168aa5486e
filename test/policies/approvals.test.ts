import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalStore } from "../../policies/approvals.js";
import { argsDigest } from "../../policies/digest.js";
import type { PolicyError } from "../../policies/errors.js";
import { FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const args = { model: "all-minilm-l6-v2", device: "cpu" };
const digest = argsDigest("load_model", args);

function setup(file = tmp.file(`a-${Math.random().toString(36).slice(2)}.db`)) {
  const clock = new FakeClock();
  const store = new SqliteApprovalStore(file, { clock: clock.now });
  const rec = store.create({
    principal: "agent",
    tool: "load_model",
    args_digest: digest,
    args_preview: args,
    estimate: null,
    ttl_s: 900,
  });
  return { clock, store, rec, file };
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
    return undefined;
  } catch (e) {
    return (e as PolicyError).code;
  }
}

describe("SqliteApprovalStore", () => {
  it("creates unguessable pending approvals", () => {
    const { store, rec } = setup();
    expect(rec.id).toMatch(/^apr_[0-9a-f]{32}$/);
    expect(rec.status).toBe("pending");
    expect(Date.parse(rec.expires_at) - Date.parse(rec.created_at)).toBe(900_000);
    expect(store.list({ status: "pending" }).map((r) => r.id)).toEqual([rec.id]);
    store.close();
  });

  it("is consumed exactly once by the same principal, tool and arguments", () => {
    const { store, rec } = setup();
    expect(codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
      "approval_pending",
    );
    store.approve(rec.id, "operator");
    expect(store.get(rec.id)).toMatchObject({ status: "approved", decided_by: "operator" });
    expect(store.consume(rec.id, "agent", "load_model", digest).status).toBe("used");
    expect(codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
      "approval_used",
    );
    store.close();
  });

  it("refuses self-grant", () => {
    const { store, rec } = setup();
    expect(codeOf(() => store.approve(rec.id, "agent"))).toBe("approval_self_grant");
    expect(codeOf(() => store.deny(rec.id, "agent"))).toBe("approval_self_grant");
    expect(store.get(rec.id)!.status).toBe("pending");
    store.close();
  });

  it("refuses another principal (as not found, revealing nothing), tool or arguments", () => {
    const { store, rec } = setup();
    store.approve(rec.id, "operator");
    expect(codeOf(() => store.consume(rec.id, "mallory", "load_model", digest))).toBe(
      "approval_not_found",
    );
    expect(codeOf(() => store.consume(rec.id, "agent", "run_benchmark", digest))).toBe(
      "approval_mismatch",
    );
    const other = argsDigest("load_model", { ...args, dtype: "float16" });
    expect(codeOf(() => store.consume(rec.id, "agent", "load_model", other))).toBe(
      "approval_mismatch",
    );
    expect(codeOf(() => store.consume("apr_nope", "agent", "load_model", digest))).toBe(
      "approval_not_found",
    );
    // Failed attempts do not use it up.
    expect(store.consume(rec.id, "agent", "load_model", digest).status).toBe("used");
    store.close();
  });

  it("expires pending approvals, and approved ones after a fresh TTL", () => {
    const { store, rec, clock } = setup();
    clock.advance(600_000);
    store.approve(rec.id, "operator");
    clock.advance(600_000); // past the original expiry, within the TTL restarted on approval
    expect(store.get(rec.id)!.status).toBe("approved");
    clock.advance(300_000);
    expect(store.get(rec.id)!.status).toBe("expired");
    expect(codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
      "approval_expired",
    );

    const late = setup();
    late.clock.advance(900_000);
    expect(codeOf(() => late.store.approve(late.rec.id, "operator"))).toBe("approval_expired");
    expect(late.store.list({ status: "expired" })).toHaveLength(1);
    store.close();
    late.store.close();
  });

  it("records denials with their reason, and decisions are final", () => {
    const { store, rec } = setup();
    store.deny(rec.id, "operator", "too big for today");
    expect(store.get(rec.id)).toMatchObject({ status: "denied", reason: "too big for today" });
    expect(codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
      "approval_denied",
    );
    expect(codeOf(() => store.approve(rec.id, "operator2"))).toBe("approval_already_decided");
    store.close();
  });

  it("finds the open approval for the same call", () => {
    const { store, rec } = setup();
    expect(store.findOpen("agent", "load_model", digest)!.id).toBe(rec.id);
    expect(store.findOpen("agent", "load_model", "0".repeat(64))).toBeUndefined();
    store.close();
  });

  it("survives reopening the file, and a second handle sees decisions at once", () => {
    const { store, rec, file, clock } = setup();
    const cli = new SqliteApprovalStore(file, { clock: clock.now }); // the CLI, concurrently
    cli.approve(rec.id, "operator");
    expect(store.get(rec.id)!.status).toBe("approved");
    store.close();
    cli.close();
    const reopened = new SqliteApprovalStore(file, { clock: clock.now });
    expect(reopened.get(rec.id)).toMatchObject({ status: "approved", args_preview: args });
    expect(reopened.consume(rec.id, "agent", "load_model", digest).status).toBe("used");
    reopened.close();
  });
});

// The kept fine-tunes' store (tools/stores/kept.ts): owner-only lookups, the per-principal bound,
// expiry by TTL and the sweep that removes files, and the index read back by a new instance (a
// restart). The end-to-end behaviour over MCP is test/e2e/fine_tune_keep.test.ts.
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { KEPT_ID, KeptModels, type KeptRecord } from "../../tools/stores/kept.js";
import { ToolError } from "../../tools/errors.js";

const MiB = 1024 ** 2;

function record(store: KeptModels, owner: string, bytes: number): KeptRecord {
  const id = KeptModels.newId();
  mkdirSync(join(store.dir, id));
  writeFileSync(join(store.dir, id, "model.safetensors"), "x");
  return {
    id,
    owner,
    base: "tiny-gpt2",
    dataset: "us-founding-texts",
    dtype: "float32",
    mode: "eager",
    steps: 6,
    report_id: "bench_00000000000000000000",
    sha256: `sha256:${"0".repeat(64)}`,
    bytes,
    created_at: new Date(0).toISOString(),
    expires_at: store.expiresAt(),
    entry: { id },
  };
}

describe("kept fine-tunes store", () => {
  it("answers an id to its owner only, and lists each principal's own", () => {
    const store = new KeptModels(mkdtempSync(join(tmpdir(), "kept-")), {
      max_bytes_per_principal: 100 * MiB,
      ttl_s: 60,
    });
    const r = record(store, "alice", MiB);
    store.add(r);
    expect(r.id).toMatch(KEPT_ID);
    expect(store.owned(r.id, "alice")?.id).toBe(r.id);
    expect(store.owned(r.id, "bob")).toBeUndefined();
    expect(store.listFor("bob")).toEqual([]);
    expect(store.listFor("alice").map((x) => x.id)).toEqual([r.id]);
  });

  it("refuses a keep over the principal's bound, counting only that principal's results", () => {
    const store = new KeptModels(mkdtempSync(join(tmpdir(), "kept-")), {
      max_bytes_per_principal: 10 * MiB,
      ttl_s: 60,
    });
    store.add(record(store, "alice", 8 * MiB));
    store.add(record(store, "bob", 9 * MiB));
    expect(() => store.checkRoom("alice", 2 * MiB)).not.toThrow();
    let err: unknown;
    try {
      store.checkRoom("alice", 3 * MiB);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ToolError);
    expect((err as ToolError).code).toBe("storage_exceeded");
    expect((err as ToolError).message).toMatch(/kept\.max_bytes_per_principal.*kept\.ttl_s/);
  });

  it("expires a result after its TTL; the sweep removes its files; a restart reads the rest", () => {
    let now = 1_000_000;
    const dir = mkdtempSync(join(tmpdir(), "kept-"));
    const store = new KeptModels(dir, { max_bytes_per_principal: 100 * MiB, ttl_s: 10 }, () => now);
    const old = record(store, "alice", MiB);
    store.add(old);
    now += 5_000;
    const young = record(store, "alice", MiB);
    store.add(young);
    now += 6_000; // the first is 11 s old, the second 6 s
    expect(store.owned(old.id, "alice")).toBeUndefined();
    expect(store.usage("alice")).toBe(MiB);
    expect(store.sweep().map((r) => r.id)).toEqual([old.id]);
    expect(existsSync(join(dir, old.id))).toBe(false);
    expect(existsSync(join(dir, young.id))).toBe(true);
    const again = new KeptModels(dir, { max_bytes_per_principal: 100 * MiB, ttl_s: 10 }, () => now);
    expect(again.listFor("alice").map((r) => r.id)).toEqual([young.id]);
  });
});

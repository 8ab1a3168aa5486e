// Kept fine-tune results (issue 47 item 2): a fine_tune run's weights written by the worker under
// <data_dir>/kept/<id>/ and recorded here, owned by the principal that ran it, counted against a
// per-principal storage bound and expiring after a TTL. The index is one JSON file beside the
// weights, which the worker also reads for the entries' catalog fields (tpu_worker/catalog.py):
// node-local, like the weights it describes.
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { CatalogEntry } from "../../runtime/catalog.js";
import { ToolError } from "../errors.js";

/** A kept model's id: its own namespace, so no catalog id is ever taken for one. */
export const KEPT_ID = /^kept-[0-9a-f]{12}$/;
export const INDEX_FILE = "index.json";

export interface KeptLimits {
  /** Bytes of kept weights one principal may hold at once. */
  max_bytes_per_principal: number;
  /** Seconds a kept result lives after its run. */
  ttl_s: number;
}

export interface KeptRecord {
  id: string;
  owner: string;
  /** The catalog model it was fine-tuned from. */
  base: string;
  dataset: string;
  /** The configuration whose weights were kept. */
  dtype: string;
  mode: string;
  steps: number;
  report_id: string;
  /** The weights' digest as the worker reports it ("sha256:<hex>"), checked at every load. */
  sha256: string;
  bytes: number;
  created_at: string;
  expires_at: string;
  /** The catalog entry the worker serves it by (the base model's, with its own id and files). */
  entry: Record<string, unknown>;
}

export class KeptModels {
  private records = new Map<string, KeptRecord>();

  constructor(
    readonly dir: string,
    readonly limits: KeptLimits,
    private readonly now: () => number = Date.now,
  ) {
    mkdirSync(dir, { recursive: true });
    const file = join(dir, INDEX_FILE);
    if (existsSync(file)) {
      const raw = JSON.parse(readFileSync(file, "utf8")) as { models?: KeptRecord[] };
      for (const r of raw.models ?? []) this.records.set(r.id, r);
    }
  }

  static newId(): string {
    return `kept-${randomBytes(6).toString("hex")}`;
  }

  private live(r: KeptRecord | undefined): KeptRecord | undefined {
    return r && Date.parse(r.expires_at) > this.now() ? r : undefined;
  }

  /** The record of `id` when `principal` owns it and it has not expired; else nothing. */
  owned(id: string, principal: string): KeptRecord | undefined {
    const r = this.live(this.records.get(id));
    return r && r.owner === principal ? r : undefined;
  }

  /** The catalog entry of a live kept model (the caller's ownership already checked). */
  entry(id: string, base: CatalogEntry): CatalogEntry | undefined {
    return this.live(this.records.get(id)) ? { ...base, id } : undefined;
  }

  record(id: string): KeptRecord | undefined {
    return this.live(this.records.get(id));
  }

  listFor(principal: string): KeptRecord[] {
    return [...this.records.values()].filter((r) => this.live(r) && r.owner === principal);
  }

  usage(principal: string): number {
    return this.listFor(principal).reduce((n, r) => n + r.bytes, 0);
  }

  /** Refuses a keep of `bytes` more that would take `principal` over the bound. */
  checkRoom(principal: string, bytes: number): void {
    const used = this.usage(principal);
    const max = this.limits.max_bytes_per_principal;
    if (used + bytes > max)
      throw new ToolError(
        "storage_exceeded",
        `keep: ${fmt(bytes)} more would take your kept results to ${fmt(used + bytes)}, over the bound of ${fmt(max)} (kept.max_bytes_per_principal); run without keep, wait for a kept result to expire (kept.ttl_s, ${this.limits.ttl_s} s), or ask the operator to raise the bound`,
      );
  }

  expiresAt(): string {
    return new Date(this.now() + this.limits.ttl_s * 1000).toISOString();
  }

  add(r: KeptRecord): void {
    this.records.set(r.id, r);
    this.save();
  }

  /** Removes a record and its files (an expired one, or a keep refused after its run). */
  remove(id: string): void {
    this.records.delete(id);
    this.save();
    this.removeFiles(id);
  }

  removeFiles(id: string): void {
    if (KEPT_ID.test(id)) rmSync(join(this.dir, id), { recursive: true, force: true });
  }

  /** The expired records, removed with their files; the caller unloads them. */
  sweep(): KeptRecord[] {
    const gone = [...this.records.values()].filter((r) => !this.live(r));
    for (const r of gone) this.remove(r.id);
    return gone;
  }

  private save(): void {
    const file = join(this.dir, INDEX_FILE);
    const tmp = `${file}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify({ models: [...this.records.values()] }, null, 1));
    renameSync(tmp, file);
  }
}

function fmt(bytes: number): string {
  return bytes >= 1024 ** 3
    ? `${(bytes / 1024 ** 3).toFixed(2)} GiB`
    : `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

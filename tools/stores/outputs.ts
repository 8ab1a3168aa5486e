// Large inference outputs, bounded in bytes and time, read back through the resource
// tpu://outputs/{id}/{index}. An output is a cache, not a record: it expires (30 min by default),
// the oldest go first when a new one needs room, and it belongs to the principal that made it
// (another principal's read is a missing output, whether or not it exists).
// MemoryOutputs keeps them in this process's memory (storage.sqlite: lost on restart);
// server/app/postgres/outputs.ts keeps them in the shared store (storage.postgres).
import { randomBytes } from "node:crypto";
import type { TensorData } from "../../runtime/types.js";

/** An output as listed: its tensors' dtype and shape, not their bytes. */
export interface StoredOutputInfo {
  id: string;
  principal: string;
  model: string;
  tensors: Omit<TensorData, "data">[];
  /** ms since the epoch (the database's clock on Postgres). */
  created_at: number;
  /** The tensors' bytes together. */
  bytes: number;
}

export interface StoredOutput extends StoredOutputInfo {
  tensors: TensorData[];
}

/** Every method answers asynchronously (a shared store asks its database). */
export interface Outputs {
  /**
   * Keeps the tensors (evicting the oldest outputs until they fit) and names them. An output
   * larger than the whole bound is named but not kept: reading it back finds nothing.
   */
  put(principal: string, model: string, tensors: TensorData[]): Promise<StoredOutput>;
  /** The output, if it is the principal's and has not expired. */
  get(id: string, principal: string): Promise<StoredOutput | undefined>;
  /** The principal's live outputs, oldest first. */
  list(principal: string): Promise<StoredOutputInfo[]>;
  /** What the kept outputs weigh together. */
  bytes(): Promise<number>;
}

export const newOutputId = () => `out_${randomBytes(12).toString("hex")}`;

/** What `tensors` weigh together. */
export const tensorBytes = (tensors: TensorData[]) =>
  tensors.reduce((n, t) => n + t.data.byteLength, 0);

/** NODE-LOCAL: this process's memory, bounded; lost on restart. */
export class MemoryOutputs implements Outputs {
  private readonly items = new Map<string, StoredOutput>();
  private total = 0;
  constructor(
    private readonly maxBytes: number,
    private readonly ttlMs = 30 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  async put(principal: string, model: string, tensors: TensorData[]): Promise<StoredOutput> {
    this.expire();
    const bytes = tensorBytes(tensors);
    // Oldest first (Map keeps insertion order) until the new one fits.
    for (const [id, o] of this.items) {
      if (this.total + bytes <= this.maxBytes) break;
      this.items.delete(id);
      this.total -= o.bytes;
    }
    const out: StoredOutput = {
      id: newOutputId(),
      principal,
      model,
      tensors,
      created_at: this.now(),
      bytes,
    };
    if (bytes <= this.maxBytes) {
      this.items.set(out.id, out);
      this.total += bytes;
    }
    return out;
  }

  async get(id: string, principal: string): Promise<StoredOutput | undefined> {
    this.expire();
    const o = this.items.get(id);
    return o && o.principal === principal ? o : undefined;
  }

  async list(principal: string): Promise<StoredOutputInfo[]> {
    this.expire();
    return [...this.items.values()].filter((o) => o.principal === principal);
  }

  async bytes(): Promise<number> {
    return this.total;
  }

  private expire(): void {
    const cutoff = this.now() - this.ttlMs;
    for (const [id, o] of this.items) {
      if (o.created_at >= cutoff) break;
      this.items.delete(id);
      this.total -= o.bytes;
    }
  }
}

// Large inference outputs live here, bounded in bytes and time, and are read back through the
// resource tpu://outputs/{id}. They are not persisted: an output is a cache, not a record.
import { randomBytes } from "node:crypto";
import type { TensorData } from "../../runtime/types.js";

export interface StoredOutput {
  id: string;
  principal: string;
  model: string;
  tensors: TensorData[];
  created_at: number;
  bytes: number;
}

export interface Outputs {
  put(principal: string, model: string, tensors: TensorData[]): StoredOutput;
  get(id: string, principal: string): StoredOutput | undefined;
  list(principal: string): StoredOutput[];
  bytes(): number;
}

export class MemoryOutputs implements Outputs {
  private readonly items = new Map<string, StoredOutput>();
  private total = 0;
  constructor(
    private readonly maxBytes: number,
    private readonly ttlMs = 30 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  put(principal: string, model: string, tensors: TensorData[]): StoredOutput {
    this.expire();
    const bytes = tensors.reduce((n, t) => n + t.data.byteLength, 0);
    // Oldest first (Map keeps insertion order) until the new one fits.
    for (const [id, o] of this.items) {
      if (this.total + bytes <= this.maxBytes) break;
      this.items.delete(id);
      this.total -= o.bytes;
    }
    const out: StoredOutput = {
      id: `out_${randomBytes(12).toString("hex")}`,
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

  get(id: string, principal: string): StoredOutput | undefined {
    this.expire();
    const o = this.items.get(id);
    return o && o.principal === principal ? o : undefined;
  }

  list(principal: string): StoredOutput[] {
    this.expire();
    return [...this.items.values()].filter((o) => o.principal === principal);
  }

  bytes(): number {
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

// Concurrency: a bounded queue of slots per tool (p-limit) and a readers-writer lane per device.
// Every wait is bounded: a full queue refuses at once with `busy` and a retry hint, because an
// agent that waits forever is worse than one told to retry.

import { namesChip } from "../../lib/device.js";
import pLimit, { type LimitFunction } from "p-limit";
import { systemClock, type Clock } from "../clock.js";
import type { LimitsConfig } from "../config.js";
import { toolConcurrency, toolQueueBound } from "../config.js";
import { PolicyError } from "../errors.js";

export type Release = () => void;
export type DeviceMode = "exclusive" | "shared" | "none";

function cancelledError(what: string): PolicyError {
  return new PolicyError("cancelled", `The call was cancelled while waiting for ${what}.`);
}

/** Exponential moving average of how long slots are held; the retry hint of a `busy` refusal. */
class HoldTimeAverage {
  private avgMs = 1000;
  observe(ms: number): void {
    this.avgMs = this.avgMs * 0.8 + ms * 0.2;
  }
  /** The wait until a slot frees for a caller with `ahead` others in front, `parallel` at a time. */
  retryHintMs(ahead: number, parallel: number): number {
    return Math.max(100, Math.round((this.avgMs * (ahead + 1)) / Math.max(1, parallel)));
  }
}

class ToolSlots {
  private readonly limit: LimitFunction;
  private waiting = 0;
  private readonly holds = new HoldTimeAverage();
  constructor(
    readonly tool: string,
    concurrency: number,
    private readonly bound: number,
    private readonly now: Clock,
  ) {
    this.limit = pLimit(concurrency);
  }

  acquire(signal?: AbortSignal): Promise<Release> {
    if (signal?.aborted) return Promise.reject(cancelledError(`a ${this.tool} slot`));
    // Only live waiters count: a cancelled one still sits in p-limit's queue but must not make
    // others busy.
    if (this.limit.activeCount >= this.limit.concurrency && this.waiting >= this.bound) {
      return Promise.reject(
        new PolicyError(
          "busy",
          `${this.tool} is at its limit (${this.limit.concurrency} running, ${this.waiting} waiting); retry later.`,
          {
            tool: this.tool,
            retry_after_ms: this.holds.retryHintMs(this.waiting, this.limit.concurrency),
            running: this.limit.activeCount,
            waiting: this.waiting,
          },
        ),
      );
    }
    return new Promise<Release>((resolve, reject) => {
      let state: "waiting" | "granted" | "aborted" = "waiting";
      this.waiting++;
      const onAbort = () => {
        if (state !== "waiting") return;
        state = "aborted";
        this.waiting--;
        reject(cancelledError(`a ${this.tool} slot`));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // The p-limit slot is held until `done` runs, i.e. until the lease is released.
      void this.limit(
        () =>
          new Promise<void>((done) => {
            signal?.removeEventListener("abort", onAbort);
            if (state === "aborted") return done();
            state = "granted";
            this.waiting--;
            const start = this.now();
            let released = false;
            resolve(() => {
              if (released) return;
              released = true;
              this.holds.observe(this.now() - start);
              done();
            });
          }),
      );
    });
  }
}

interface LaneWaiter {
  mode: "exclusive" | "shared";
  grant: () => void;
}

/**
 * A FIFO readers-writer lock on one device: exclusive tools (load, benchmark...) hold it alone,
 * shared ones (inference) together. A shared call queued behind an exclusive one waits its turn,
 * so a stream of inference calls cannot starve a load.
 */
class DeviceLane {
  private readers = 0;
  private writer = false;
  private readonly queue: LaneWaiter[] = [];
  private readonly holds = new HoldTimeAverage();
  constructor(
    readonly device: string,
    private readonly bound: number,
    private readonly now: Clock,
  ) {}

  private fits(mode: "exclusive" | "shared"): boolean {
    return mode === "shared" ? !this.writer : !this.writer && this.readers === 0;
  }

  private take(mode: "exclusive" | "shared"): Release {
    if (mode === "shared") this.readers++;
    else this.writer = true;
    const start = this.now();
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.holds.observe(this.now() - start);
      if (mode === "shared") this.readers--;
      else this.writer = false;
      this.pump();
    };
  }

  private pump(): void {
    while (this.queue.length > 0 && this.fits(this.queue[0]!.mode)) this.queue.shift()!.grant();
  }

  acquire(mode: "exclusive" | "shared", signal?: AbortSignal): Promise<Release> {
    if (signal?.aborted) return Promise.reject(cancelledError(`device ${this.device}`));
    if (this.queue.length === 0 && this.fits(mode)) return Promise.resolve(this.take(mode));
    if (this.queue.length >= this.bound) {
      return Promise.reject(
        new PolicyError(
          "busy",
          `Device ${this.device} is busy (${this.writer ? "held exclusively" : `${this.readers} shared calls`}, ${this.queue.length} waiting); retry later.`,
          {
            device: this.device,
            retry_after_ms: this.holds.retryHintMs(this.queue.length, 1),
            waiting: this.queue.length,
          },
        ),
      );
    }
    return new Promise<Release>((resolve, reject) => {
      const waiter: LaneWaiter = {
        mode,
        grant: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve(this.take(mode));
        },
      };
      const onAbort = () => {
        const i = this.queue.indexOf(waiter);
        if (i < 0) return;
        this.queue.splice(i, 1);
        // A cancelled exclusive waiter may have been the only thing holding shared ones back.
        this.pump();
        reject(cancelledError(`device ${this.device}`));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.queue.push(waiter);
    });
  }
}

/** "tpu" and "tpu:0" are the same device lane. */
export function deviceKey(device: string): string {
  return namesChip(device) ? device : `${device}:0`;
}

export class ConcurrencyLimiter {
  private readonly tools = new Map<string, ToolSlots>();
  private readonly lanes = new Map<string, DeviceLane>();
  private readonly exclusive: ReadonlySet<string>;
  private readonly shared: ReadonlySet<string>;

  constructor(
    private readonly limits: LimitsConfig,
    private readonly clock: Clock = systemClock,
  ) {
    this.exclusive = new Set(limits.device_exclusive_tools);
    this.shared = new Set(limits.device_shared_tools);
  }

  deviceMode(tool: string): DeviceMode {
    if (this.exclusive.has(tool)) return "exclusive";
    if (this.shared.has(tool)) return "shared";
    return "none";
  }

  private slots(tool: string): ToolSlots {
    let s = this.tools.get(tool);
    if (!s) {
      s = new ToolSlots(
        tool,
        toolConcurrency(this.limits, tool),
        toolQueueBound(this.limits, tool),
        this.clock,
      );
      this.tools.set(tool, s);
    }
    return s;
  }

  private lane(device: string): DeviceLane {
    const key = deviceKey(device);
    let l = this.lanes.get(key);
    if (!l) {
      l = new DeviceLane(key, this.limits.device_queue_bound, this.clock);
      this.lanes.set(key, l);
    }
    return l;
  }

  /**
   * A tool slot, then (for device tools) the device lane — always in that order, so two callers
   * can never hold one each and wait for the other. Rejects with busy or cancelled.
   */
  async acquire(tool: string, device: string | undefined, signal?: AbortSignal): Promise<Release> {
    const releaseTool = await this.slots(tool).acquire(signal);
    const mode = this.deviceMode(tool);
    if (mode === "none" || !device) return releaseTool;
    try {
      const releaseLane = await this.lane(device).acquire(mode, signal);
      return () => {
        releaseLane();
        releaseTool();
      };
    } catch (e) {
      releaseTool();
      throw e;
    }
  }
}

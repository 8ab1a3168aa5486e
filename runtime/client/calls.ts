// The request table: every call sent to the current worker and not yet ended by it, with its
// timers and abort wiring. A call is `settled` once its caller has an answer (result, error,
// timeout, cancel); its entry stays until the worker ends the request (or dies), so a late
// answer is recognised and dropped, and inFlight() counts only calls still waiting.
import { RuntimeCallError, type CallOptions, type CallResult, type StopReason } from "../types.js";
import type { WorkerProc } from "./process.js";
import type { PendingTrace } from "./worker_trace.js";

export interface Pending {
  id: string;
  op: string;
  args: Record<string, unknown>;
  proc: WorkerProc;
  resolve: (r: CallResult<any>) => void;
  reject: (e: RuntimeCallError) => void;
  onProgress?: CallOptions["onProgress"];
  trace?: PendingTrace;
  /** The caller has its answer; the entry stays until the worker ends the request. */
  settled: boolean;
  cancelRequested: boolean;
  /** The gate stopped the call (budget, timeout): the worker answers with what it has. */
  stopReason?: StopReason;
  /** Cancelled by a caller that keeps the finished part (cancel_job): any answer is kept. */
  keepPartial?: boolean;
  timer?: NodeJS.Timeout;
  graceTimer?: NodeJS.Timeout;
  /** A stopped call's last chance to end before its worker is restarted (stopGraceMs). */
  stopTimer?: NodeJS.Timeout;
  detachAbort?: () => void;
}

export class CallTable {
  private readonly pending = new Map<string, Pending>();
  /** Traced calls in the table: only while there are some is a chunk's arrival time read. */
  private traced = 0;

  add(p: Pending): void {
    this.pending.set(p.id, p);
    if (p.trace) this.traced++;
  }

  get(id: string): Pending | undefined {
    return this.pending.get(id);
  }

  all(): Pending[] {
    return [...this.pending.values()];
  }

  get tracing(): boolean {
    return this.traced > 0;
  }

  /** Calls whose callers still wait for an answer. */
  inFlight(): number {
    let n = 0;
    for (const p of this.pending.values()) if (!p.settled) n++;
    return n;
  }

  /** The worker ended the request (or is gone): the entry leaves the table. */
  forget(p: Pending): void {
    if (this.pending.delete(p.id) && p.trace) this.traced--;
  }

  /** Gives the caller its answer, once; later answers are dropped. */
  settle(p: Pending, fn: () => void): void {
    if (p.settled) return;
    p.settled = true;
    clearTimers(p);
    fn();
  }
}

export function clearTimers(p: Pending): void {
  clearTimeout(p.timer);
  clearTimeout(p.graceTimer);
  clearTimeout(p.stopTimer);
  p.detachAbort?.();
  p.detachAbort = undefined;
}

export function closedError(): RuntimeCallError {
  return new RuntimeCallError(
    "worker_unavailable",
    "The runtime is shut down. Restart the server to use the worker again.",
    false,
  );
}

export function cancelledError(op: string, how: string): RuntimeCallError {
  return new RuntimeCallError("cancelled", `${op} was cancelled ${how}.`, true, { op });
}

/** Waits for `p`, or rejects with `onAbort()` as soon as `signal` aborts. */
export function abortable<T>(
  p: Promise<T>,
  signal: AbortSignal | undefined,
  onAbort: () => Error,
): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(onAbort());
  return new Promise<T>((resolve, reject) => {
    const stop = () => reject(onAbort());
    signal.addEventListener("abort", stop, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", stop));
  });
}

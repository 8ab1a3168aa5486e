// Placement policy: which worker of a pool takes a call. Decided once per tool call (`place`),
// before the gate queues it on that worker's lane; the call then gets the same ticket and runs
// there (pool.ts fails over explicitly when the chosen worker died or was drained meanwhile).
//
// - load: candidates are usable workers (ready, undrained) of the device asked for that do not
//   hold the model yet, ordered by fewest loaded models, then fewest calls in flight.
// - bench/check: the worker `device` names, else the least busy usable one of the right kind.
// - infer: routed when sent, among the replicas holding the model: power of two choices on calls
//   in flight (two replicas drawn at random, the less loaded one taken), each replica capped.
import { randomInt } from "node:crypto";
import type { Placement } from "../types.js";
import { namesChip } from "../../lib/device.js";
import type { Member } from "./member.js";

/** A random index in [0, n): crypto's by default; tests inject a seeded one. */
export type Pick = (n: number) => number;

export const randomPick: Pick = (n) => randomInt(n);

/** The ticket `Runtime.place` hands out; the pool notes on it where the call's work ran. */
export class Ticket implements Placement {
  private readonly on: string[] = [];
  constructor(
    readonly op: string,
    readonly lane: string | undefined,
    readonly worker: string | undefined,
    /** A pool of one records nothing: its audit records never named a worker. */
    private readonly records = true,
  ) {}
  ran(): string[] {
    return [...this.on];
  }
  note(worker: string): void {
    if (this.records && !this.on.includes(worker)) this.on.push(worker);
  }
}

/** Workers a device string names: a worker name, a chip (`tpu:3`), a kind (`cpu`), `auto`. */
export function resolve(members: readonly Member[], device: string): Member[] {
  const named = members.filter((m) => m.name === device);
  if (named.length) return named;
  if (device === "auto") return [...members];
  if (namesChip(device)) return members.filter((m) => m.device === device);
  return members.filter((m) => m.kind === device);
}

/** The one worker a device string names (a worker or a chip), or undefined for a kind. */
export function named(members: readonly Member[], device: string | undefined): Member | undefined {
  if (!device) return undefined;
  return (
    members.find((m) => m.name === device) ??
    (namesChip(device) ? members.find((m) => m.device === device) : undefined)
  );
}

/** Usable workers for `device` (all when absent); for a load, those not holding the model yet. */
export function candidates(
  members: readonly Member[],
  device: string | undefined,
  loadModel: string | undefined,
): Member[] {
  const scope = device ? resolve(members, device) : members;
  return scope.filter((m) => m.usable && !(loadModel && m.holds(loadModel)));
}

/** Fewest loaded models, then fewest calls in flight, then configuration order. */
export function order(ms: readonly Member[]): Member[] {
  return [...ms].sort(
    (a, b) => a.models().length - b.models().length || a.inFlight() - b.inFlight(),
  );
}

/**
 * Power of two choices: two distinct replicas drawn at random, the one with fewer calls in
 * flight taken (the first drawn on a tie). Spreads load like "least loaded" without every caller
 * piling onto the same replica between two looks at the counters.
 */
export function powerOfTwo(open: readonly Member[], pick: Pick): Member {
  if (open.length === 1) return open[0]!;
  const i = pick(open.length);
  let j = pick(open.length - 1);
  if (j >= i) j++; // distinct from i, uniformly among the others
  const a = open[i]!;
  const b = open[j]!;
  return b.inFlight() < a.inFlight() ? b : a;
}

/**
 * Where a call of `op` runs, decided now: the lane is the worker it will hold when its args tell
 * (a named worker or chip, the only holder for unload, the pick for load/bench/check); none when
 * the pool routes each call when it is sent (infer, several replicas) or no worker is known yet
 * (a pool still expanding its per-device workers).
 */
export function choose(
  members: readonly Member[],
  op: string,
  args: Record<string, unknown>,
): Ticket {
  const device = typeof args.device === "string" ? args.device : undefined;
  const model = typeof args.model === "string" ? args.model : undefined;
  const one = named(members, device);
  if (one) return new Ticket(op, one.name, one.name);
  switch (op) {
    case "unload": {
      // Unload acts on every holder when it is sent; one holder now is the lane to wait on.
      const holders = members.filter((m) => model && m.holds(model));
      return new Ticket(op, holders.length === 1 ? holders[0]!.name : undefined, undefined);
    }
    case "load":
      if (typeof args.replicas === "number" && args.replicas > 1)
        return new Ticket(op, undefined, undefined);
    // falls through: one replica is placed like bench and check
    case "benchmark":
    case "check": {
      const m = order(candidates(members, device, op === "load" ? model : undefined))[0];
      return new Ticket(op, m?.name, m?.name);
    }
    default:
      return new Ticket(op, undefined, undefined);
  }
}

// One kind of work an estimate prices (a load, a check, a benchmark, an inference): its file says
// what of a call's arguments it reads, which of its calls compare, and what the device model
// says it costs. kinds.ts holds one of each.
import type { Modelled } from "./model.js";
import type { EstimateAssumptions, EstimateInput, Work } from "./types.js";

export interface WorkKind {
  /** The call's work as kept with its measurement (JSON-safe), with the dtype it runs in. */
  work(
    input: EstimateInput,
    at: { a: EstimateAssumptions; dtype: string; keep: (...keys: string[]) => Work },
  ): Work;
  /** Calls of one class can stand for each other after scaling; other classes never do. */
  classOf(w: Work): string;
  /** What the device model says the work costs (its arguments are `input.args`). */
  modelled(
    input: EstimateInput,
    at: {
      a: EstimateAssumptions;
      dtype: string;
      /** One graph's compile on this device kind. */
      compileGraph: number;
      /** The model is resident already (its weights are not read again). */
      alreadyLoaded: boolean;
      /** The device kind (cpu, tpu, ...). */
      device: string;
    },
  ): Modelled;
}

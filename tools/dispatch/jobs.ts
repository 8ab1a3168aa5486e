// A call of a job tool (its record says job: true): answered with its result, or with a job id
// when it was asked not to wait or outlives the soft deadline (dispatch.ts decides which).
import { InputRequired, type CallDeadline, type GateCall } from "../../policies/gate/gate.js";
import { stopReasonOf } from "../../runtime/types.js";
import { ToolError } from "../errors.js";
import type { JobRecord } from "../stores/jobs.js";
import type { ToolContext } from "../types.js";
import type { DispatchInput } from "./dispatch.js";
import { checkOutput } from "./result.js";

export interface JobHandOff {
  /** wait: false: the job id is the answer as soon as the gate admits the call. */
  atStart: boolean;
  /** The soft deadline in ms (0: none), counted from `arrivedAt`. */
  softMs: number;
  /** When the request arrived (performance.now()). */
  arrivedAt: number;
  /** Told the job id when the call is answered by its job (the surface may show it as a task). */
  onHandOut?: (jobId: string) => void;
  /**
   * A gate refusal after the hand-off (the call was not run) may be waited out by the job: the
   * work this returns (given the job's signal and progress) is the job's instead of the refusal.
   */
  afterRefusal?: (
    e: unknown,
    signal: AbortSignal,
    progress: ToolContext["progress"],
  ) => Promise<Record<string, unknown>> | undefined;
}

/**
 * A job tool's call. With wait: false it becomes a job once the gate admits it and the job id is
 * the answer. With wait: true the result is the answer if it comes within the soft deadline;
 * otherwise the call is adopted by a new job and its id is the answer (the call goes on; get_job
 * has its progress and then its result). The soft deadline counts from the request's arrival, so
 * time spent queued behind other calls or waiting for an approval in the client is part of it: a
 * client's own request timeout (60 s in the SDKs) counts from there too. A call adopted before the
 * gate admitted it keeps its place in the queue; the job then fails with the gate's refusal, if
 * any. Until the caller holds a job id, its cancellation or disconnect cancels the call: nobody
 * could ever collect it. The work keeps the gate's slot, reservation and deadline until it ends,
 * and the gate audits how it ended; a refusal (approval, budget, busy) or an in-band question
 * before the hand-off still comes back to this caller.
 */
export function runAsJob(
  input: DispatchInput,
  call: GateCall,
  args: Record<string, any>,
  ctxFor: (s: AbortSignal, p: ToolContext["progress"], d?: CallDeadline) => ToolContext,
  handOff: JobHandOff,
): Promise<Record<string, unknown> | InputRequired> {
  const { tool, principal } = input;
  const jobs = input.base.jobs;
  // Stops the gate's wait and the work: the caller's signal until it holds a job id, and
  // cancel_job on a job that has not started yet.
  const ctl = new AbortController();
  // cancel_job reaches the running work through this one (the gate records how it ended).
  const jobCtl = new AbortController();
  let handedOut = false;
  const onCallerAbort = () => {
    if (!handedOut) ctl.abort(input.signal.reason);
  };
  if (input.signal.aborted) onCallerAbort();
  else input.signal.addEventListener("abort", onCallerAbort, { once: true });

  // What a job adopts: the handler's result once it runs (a benchmark stopped early hands back its
  // finished part), or the gate's refusal when it never ran.
  let started = false;
  let settle!: { resolve: (v: Record<string, unknown>) => void; reject: (e: unknown) => void };
  const outcome = new Promise<Record<string, unknown>>((resolve, reject) => {
    settle = { resolve, reject };
  });
  outcome.catch(() => {}); // nobody awaits it unless a job adopted the call
  let jobProgress: ToolContext["progress"] | undefined;
  // The newest progress, so a job adopting running work starts from it (a one-configuration
  // benchmark reports 0 of 1 at its start and nothing more until it ends).
  let last: Parameters<ToolContext["progress"]> | undefined;
  const report: ToolContext["progress"] = (p, total, message) => {
    last = [p, total, message];
    jobProgress?.(p, total, message);
    if (!handedOut) input.progress(p, total, message);
  };
  let job: Promise<JobRecord> | undefined;
  let jobSignal: AbortSignal | undefined;
  const adopt = (): Promise<JobRecord> =>
    (job ??= jobs.start(tool.name, principal.id, (signal, progress) => {
      jobSignal = signal;
      jobProgress = progress;
      if (last) progress(...last);
      else if (!started)
        progress(0, undefined, "waiting to start (for the device, the worker or an approval)");
      const stop = () => {
        jobCtl.abort(signal.reason);
        if (!started) ctl.abort(signal.reason);
      };
      if (signal.aborted) stop();
      else signal.addEventListener("abort", stop, { once: true });
      // What get_job serves is checked as a direct answer is: a result that drifted from the
      // tool's output schema ends the job `internal` (logged with its fields).
      return outcome.then((r) => checkOutput(tool, r, input.logger));
    }));

  return new Promise<Record<string, unknown> | InputRequired>((resolve, reject) => {
    let answered = false;
    const answer = (fn: () => void) => {
      if (answered) return;
      answered = true;
      fn();
    };
    // The call is answered by its job from here: a result that comes while the job's row is
    // being written is the job's. A store that cannot write it fails the call, and the work
    // stops (nobody could collect it).
    const handOut = (message: (jobId: string) => string) => {
      answer(
        () =>
          void adopt().then(
            ({ job_id }) => {
              handedOut = true;
              handOff.onHandOut?.(job_id);
              input.signal.removeEventListener("abort", onCallerAbort);
              resolve({ job_id, status: "running", message: message(job_id) });
            },
            (e: unknown) => {
              ctl.abort(e);
              jobCtl.abort(e);
              reject(e);
            },
          ),
      );
    };
    const follow = (id: string) => `follow it with get_job (job_id ${id}), stop it with cancel_job`;
    const { softMs } = handOff;
    const timer =
      softMs > 0
        ? setTimeout(
            () =>
              handOut(
                (id) =>
                  `${started ? "still running" : "still waiting to start (for the device, the worker or an approval)"} after ${softMs / 1000} s, so this call answers with a job instead of holding the request open; ${follow(id)}`,
              ),
            Math.max(0, softMs - (performance.now() - handOff.arrivedAt)),
          )
        : undefined;

    input.gate
      .run({ ...call, signal: ctl.signal }, async (gateSignal, deadline) => {
        started = true;
        const signal = AbortSignal.any([gateSignal, jobCtl.signal]);
        // The handler starts on the next microtask, after a job (if any) has adopted it.
        const work = Promise.resolve().then(() =>
          tool.handler(args, ctxFor(signal, report, deadline)),
        );
        // A job the gate stopped (budget, timeout, approval) that ends without a partial result
        // fails with the gate's reason, not with the worker's cancellation (never "cancelled by
        // the caller": nobody cancelled it).
        work.then(settle.resolve, (e) =>
          settle.reject(stopReasonOf(gateSignal.reason) ? gateSignal.reason : e),
        );
        if (handOff.atStart) handOut((id) => `started; ${follow(id)}`);
        // The gate audits how the work ended, whoever collects it.
        const result = await work;
        // A job stopped by cancel_job or an operator hands back its finished part (a benchmark's
        // completed configurations, flagged cancelled), which the job keeps as its result; the
        // call itself did not run as asked, so the gate records it failed with code cancelled,
        // as it does a caller's cancellation (jobs.ts in stores/ calls the job cancelled alike).
        if (isCancelledResult(result)) {
          const why = jobCtl.signal.aborted
            ? String((jobCtl.signal.reason as Error)?.message ?? "")
            : "";
          throw new ToolError(
            "cancelled",
            `${tool.name} was ${why || "cancelled"}; the finished part is the job's result.`,
          );
        }
        return result;
      })
      .then(
        (value) => {
          // A question for the user after the hand-off has nobody to ask: the job says how to
          // get the approval out of band instead.
          if (value instanceof InputRequired)
            settle.reject(
              new ToolError(
                "approval_required",
                `This call needs the user's approval (approval ${value.approvalId}), which a job cannot ask for: call ${tool.name} again with the same arguments, or with approval_id "${value.approvalId}" once an operator approved it.`,
                { approval_id: value.approvalId },
              ),
            );
          answer(() => resolve(value));
        },
        (e) => {
          if (!started) {
            const next =
              handedOut && jobSignal && jobProgress
                ? handOff.afterRefusal?.(e, jobSignal, jobProgress)
                : undefined;
            if (next) next.then(settle.resolve, settle.reject);
            else settle.reject(e);
          }
          answer(() => reject(e));
        },
      )
      .finally(() => {
        clearTimeout(timer);
        input.signal.removeEventListener("abort", onCallerAbort);
      });
  });
}

/** A result that says the work stopped early on a cancel (the job store's test, stores/jobs.ts). */
function isCancelledResult(result: unknown): boolean {
  return (result as { cancelled?: unknown } | null)?.cancelled === true;
}

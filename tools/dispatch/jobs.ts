// A call of a job tool (its record says job: true): answered with its result, or with a job id
// when it was asked not to wait or outlives the soft deadline (dispatch.ts decides which).
import type { CallDeadline, GateCall, InputRequired } from "../../policies/gate/gate.js";
import { stopReasonOf } from "../../runtime/types.js";
import { ToolError } from "../errors.js";
import type { ToolContext } from "../types.js";
import type { DispatchInput } from "./dispatch.js";
import { checkOutput } from "./result.js";

/**
 * A job tool once the gate admits it. With wait: false (softMs 0) it becomes a job at once and
 * the job id is the answer. With wait: true the result is the answer if it comes within the soft
 * deadline; otherwise the running work is adopted by a new job and its id is the answer (the work
 * goes on; get_job has its progress and then its result). Until the caller holds a job id, its
 * cancellation or disconnect cancels the work: nobody could ever collect it. The work keeps the
 * gate's slot, reservation and deadline until it ends, and the gate audits how it ended; a
 * refusal (approval, budget, busy) or an in-band question still comes back to this caller at once.
 */
export function runAsJob(
  input: DispatchInput,
  call: GateCall,
  args: Record<string, any>,
  ctxFor: (s: AbortSignal, p: ToolContext["progress"], d?: CallDeadline) => ToolContext,
  softMs: number,
): Promise<Record<string, unknown> | InputRequired> {
  const { tool, principal } = input;
  const jobs = input.base.jobs;
  // Mirrors the caller's signal only until the caller holds a job id.
  const callerCtl = new AbortController();
  let handedOut = false;
  const onCallerAbort = () => {
    if (!handedOut) callerCtl.abort(input.signal.reason);
  };
  if (input.signal.aborted) onCallerAbort();
  else input.signal.addEventListener("abort", onCallerAbort, { once: true });

  return new Promise<Record<string, unknown> | InputRequired>((resolve, reject) => {
    let answered = false;
    const answer = (fn: () => void) => {
      if (answered) return;
      answered = true;
      fn();
    };
    const handOut = (jobId: string, message: string) => {
      handedOut = true;
      input.signal.removeEventListener("abort", onCallerAbort);
      answer(() => resolve({ job_id: jobId, status: "running", message }));
    };

    input.gate
      .run({ ...call, signal: callerCtl.signal }, async (gateSignal, deadline) => {
        // cancel_job reaches the work through this controller once a job owns it.
        const jobCtl = new AbortController();
        let jobProgress: ToolContext["progress"] | undefined;
        const report: ToolContext["progress"] = (p, total, message) => {
          jobProgress?.(p, total, message);
          if (!handedOut) input.progress(p, total, message);
        };
        // A job the gate stopped (budget, timeout, approval) that ends without a partial result
        // fails with the gate's reason, not with the worker's cancellation (never "cancelled
        // by the caller": nobody cancelled it).
        const stopOf = (e: unknown) => {
          throw stopReasonOf(gateSignal.reason) ? gateSignal.reason : e;
        };
        const adopt = (work: Promise<Record<string, unknown>>) =>
          jobs.start(tool.name, principal.id, (jobSignal, progress) => {
            jobProgress = progress;
            if (jobSignal.aborted) jobCtl.abort(jobSignal.reason);
            else
              jobSignal.addEventListener("abort", () => jobCtl.abort(jobSignal.reason), {
                once: true,
              });
            // What get_job serves is checked as a direct answer is: a result that drifted from
            // the tool's output schema ends the job `internal` (logged with its fields).
            return work.then((r) => checkOutput(tool, r, input.logger), stopOf);
          });
        const signal = AbortSignal.any([gateSignal, jobCtl.signal]);
        // The handler starts on the next microtask, after a job (if any) has adopted it.
        const work = Promise.resolve().then(() =>
          tool.handler(args, ctxFor(signal, report, deadline)),
        );
        if (softMs === 0) {
          const job = adopt(work);
          handOut(
            job.job_id,
            `started; follow it with get_job (job_id ${job.job_id}), stop it with cancel_job`,
          );
        } else {
          const timer = setTimeout(() => {
            const job = adopt(work);
            handOut(
              job.job_id,
              `still running after ${softMs / 1000} s, so this call answers with a job instead of holding the request open; follow it with get_job (job_id ${job.job_id}), stop it with cancel_job`,
            );
          }, softMs);
          work.then(
            () => clearTimeout(timer),
            () => clearTimeout(timer),
          );
        }
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
        (value) => answer(() => resolve(value)),
        (e) => answer(() => reject(e)),
      )
      .finally(() => input.signal.removeEventListener("abort", onCallerAbort));
  });
}

/** A result that says the work stopped early on a cancel (the job store's test, stores/jobs.ts). */
function isCancelledResult(result: unknown): boolean {
  return (result as { cancelled?: unknown } | null)?.cancelled === true;
}

import { z } from "zod";
import { KEPT_ID } from "./stores/kept.js";
import { hostOnlyPolicy } from "../policies/tool_policy.js";
import { RuntimeCallError } from "../runtime/types.js";
import type { StatusResult } from "../runtime/wire/ops.js";
import { Compiles, PrefixCacheStatus, ShapePlan, ShapesSeen } from "./schemas.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

const Device = z
  .object({
    kind: z.string(),
    name: z.string(),
    index: z.number().int(),
    count: z.number().int(),
    memory_total_bytes: z.number().int().nullable(),
    memory_free_bytes: z.number().int().nullable(),
    backend: z.string(),
    backend_version: z.string().nullable(),
  })
  .passthrough();

/** What the server and its policies know of get_runtime_status (policies/tool_policy.ts). */
const policy = hostOnlyPolicy("get_runtime_status", "models:read");

/**
 * The tool, and its schema as published: without a pool, no `workers`; without a Ray fleet, no
 * `fleet` (about 3.4 KB an agent would read in every conversation). Answers are still checked
 * against the full output schema.
 */
const build = (env: ToolEnv) => {
  const tool = defineTool(policy, {
    title: "Runtime status",
    description:
      "Use first and when a call fails: devices, memory, torch version, loaded models, queues, worker health.",
    input: z
      .object({
        // sha256 of each torch model's weights as they are in memory (reads every weight)
        weights_checksum: z.boolean().optional(),
      })
      .strict(),
    output: z.object({
      worker: z.object({
        state: z.string(),
        pid: z.number().int().nullable(),
        restarts: z.number().int(),
        in_flight: z.number().int(),
        lost_models: z.array(z.string()),
        last_error: z
          .string()
          .nullable()
          .optional()
          .describe("why no worker is serving: the last exit, refusal or failure"),
      }),
      device_unavailable: z
        .object({ code: z.string(), message: z.string() })
        .nullable()
        .optional()
        .describe(
          "set when no worker could answer: device, devices, versions and loaded are then empty, the rest is what the control plane knows",
        ),
      setup: z
        .object({
          state: z.enum(["running", "done", "failed"]),
          step: z.string(),
          percent: z.number(),
          message: z.string(),
          log: z.string(),
          error: z.string().nullable(),
        })
        .optional()
        .describe(
          "an installed package's first set-up (Python environment, model files) until it has finished: device tools answer runtime_setting_up meanwhile",
        ),
      device: Device.nullable(),
      devices: z.array(Device),
      probe: z.array(z.object({ backend: z.string(), matched: z.boolean(), reason: z.string() })),
      torch_version: z.string().nullable(),
      backend_version: z.string().nullable(),
      execution_mode: z.string().nullable(),
      matmul_precision: z.string().nullable(),
      loaded: z.array(
        z
          .object({
            model: z.string(),
            device: z.string(),
            dtype: z.string(),
            mode: z.string(),
            queue_depth: z.number().int(),
            weights_checksum: z.string().optional(),
            engine: z
              .object({
                name: z.string(),
                version: z.string().nullable(),
                health: z.string(),
                restarts: z.number().int(),
              })
              .passthrough()
              .optional()
              .describe("a model served by vLLM: its version, health and restarts"),
            shape_plan: ShapePlan.nullable().optional(),
            shapes: ShapesSeen.optional(),
            compiles: Compiles.optional(),
            // prefix_cache (PrefixCacheStatus) passes through, like batching: not listed, to keep
            // tools/list small.
          })
          .passthrough(),
      ),
      jobs_running: z.number().int(),
      replica: z
        .object({
          id: z.string(),
          storage: z.enum(["sqlite", "postgres"]),
          shard: z.boolean(),
          note: z.string(),
        })
        .optional()
        .describe(
          "the replica that answered; shard: some workers it reaches are its alone: their models and queues are not the fleet's",
        ),
      workers: z
        .array(
          z.object({
            name: z.string(),
            device: z.string(),
            kind: z.enum(["local", "remote"]),
            address: z.string().nullable(),
            state: z.string(),
            draining: z.boolean(),
            restarts: z.number().int(),
            pid: z.number().int().nullable(),
            in_flight: z.number().int(),
            calls: z.number().int(),
            failures: z.number().int(),
            memory_total_bytes: z.number().int().nullable(),
            memory_free_bytes: z.number().int().nullable(),
            models: z.array(z.string()),
            lost_models: z.array(z.string()),
            last_error: z.string().nullable().optional(),
            chip: z
              .object({
                kind: z.string(),
                index: z.number().int(),
                name: z.string(),
                backend: z.string(),
              })
              .nullable()
              .optional()
              .describe(
                "the device this worker's own hello reported (one chip per worker on a TPU host)",
              ),
          }),
        )
        .optional()
        .describe("with a worker pool: every worker, its state and the models it holds"),
      fleet: z
        .object({
          state: z
            .string()
            .describe("the fleet driver: starting, ready, refused, restarting, stopped"),
          address: z.string().describe("the Ray cluster (runtime.ray.address)"),
          mode: z.string().describe("placement: per-chip, per-host, count, slice"),
          ray_version: z.string().nullable(),
          capacity: z.number().int().nullable(),
          target: z.number().int().nullable().describe("actors wanted"),
          observed: z.number().int().describe("actors placed and serving"),
          driver_restarts: z.number().int(),
          actor_restarts: z.number().int(),
          error: z.object({ code: z.string(), message: z.string() }).nullable(),
          leader: z
            .string()
            .nullable()
            .optional()
            .describe("storage.postgres: the replica running the driver; all serve its actors"),
          actors: z.array(
            z.object({
              name: z.string(),
              state: z.string(),
              restarts: z.number().int(),
              address: z.string().nullable(),
              device: z.string().nullable(),
              node: z.string().nullable(),
            }),
          ),
        })
        .optional()
        .describe(
          "with a Ray fleet (runtime.ray): the driver, target vs observed actors, restarts",
        ),
    }),
    annotations: {
      readOnlyHint: true,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
    async handler(args, ctx) {
      const rt = ctx.runtime;
      // The device part comes from a worker; when none can answer (all down, a crash loop, a
      // refused fleet) status still answers with what the control plane knows, and says why.
      let result: Partial<StatusResult> = {};
      let unavailable: { code: string; message: string } | null = null;
      try {
        const ask = args.weights_checksum ? { weights_checksum: true } : {};
        ({ result } = await rt.call("status", ask, { signal: ctx.signal }));
      } catch (e) {
        if (!(e instanceof RuntimeCallError) || !UNAVAILABLE.has(e.code)) throw e;
        unavailable = { code: e.code, message: e.message };
      }
      const setup = ctx.setup?.() ?? null;
      const workers = rt.workers();
      const down = workers.filter((w) => w.state !== "ready" && w.last_error);
      return {
        worker: {
          state: rt.state,
          pid: rt.hello?.pid ?? null,
          restarts: rt.restarts(),
          in_flight: rt.inFlight(),
          lost_models: rt.lostModels(),
          last_error: rt.single
            ? (down[0]?.last_error ?? null)
            : down.map((w) => `${w.name}: ${w.last_error}`).join("; ") || null,
        },
        ...(unavailable ? { device_unavailable: unavailable } : {}),
        ...(setup ? { setup } : {}),
        device: result.device ?? null,
        devices: result.devices ?? [],
        probe: result.probe ?? rt.hello?.probe ?? [],
        torch_version: result.torch_version ?? null,
        backend_version: result.backend_version ?? null,
        execution_mode: result.execution_mode ?? null,
        matmul_precision: result.matmul_precision ?? null,
        // Another principal's kept fine-tune is not shown: its existence is its owner's to know.
        loaded: (result.loaded ?? []).filter(
          (m: { model: string }) =>
            !KEPT_ID.test(m.model) || ctx.env.kept?.owned(m.model, ctx.principal.id),
        ),
        jobs_running: ctx.jobs.running(),
        ...(ctx.replica ? { replica: ctx.replica() } : {}),
        // The default pool of one worker shows no `workers` (its one worker is the status itself).
        ...(rt.single ? {} : { workers }),
        ...(ctx.fleet ? { fleet: ctx.fleet() } : {}),
      };
    },
    render: (o) =>
      (o.setup
        ? `setting up (${o.setup.state}, ${o.setup.percent}%: ${o.setup.step}; log ${o.setup.log}); `
        : "") +
      (o.device_unavailable
        ? `device status unavailable (${o.device_unavailable.code}: ${o.device_unavailable.message}); `
        : "") +
      `worker ${o.worker.state}${o.device ? ` on ${o.device.kind} (${o.device.name})` : ""}; torch ${o.torch_version}; ` +
      `loaded: ${o.loaded.map((m) => `${m.model} [${m.dtype}, ${m.mode}, queue ${m.queue_depth}${m.engine ? `, vLLM ${m.engine.version ?? "?"} ${m.engine.health}` : ""}${shapesNote(m)}${prefixNote((m as { prefix_cache?: PrefixCacheStatus }).prefix_cache)}]`).join(", ") || "none"}` +
      (o.worker.lost_models.length
        ? `; lost in a worker restart: ${o.worker.lost_models.join(", ")}`
        : "") +
      (o.workers
        ? `; workers: ${o.workers.map((w) => `${w.name} ${w.device} ${w.state}${w.draining ? " (drained)" : ""} [${w.models.join(", ") || "-"}]`).join("; ")}`
        : "") +
      (o.replica?.storage === "postgres"
        ? `; replica ${o.replica.id}${o.replica.shard ? " (a shard: some workers are its own)" : " (one fleet: its workers are shared)"}`
        : "") +
      (o.fleet
        ? `; Ray fleet ${o.fleet.state} at ${o.fleet.address} (${o.fleet.mode}): ${o.fleet.observed}/${o.fleet.target ?? "?"} actors serving` +
          (o.fleet.leader !== undefined
            ? `, shared by the replicas (driver on ${o.fleet.leader ?? "no replica yet"})`
            : "")
        : ""),
  });
  const absent = {
    ...(env.deployment?.pool === false ? { workers: true as const } : {}),
    ...(env.deployment?.fleet === false ? { fleet: true as const } : {}),
    ...(env.deployment?.setup === false ? { setup: true as const } : {}),
  };
  return { ...tool, listedOutput: tool.output.omit(absent) };
};

/** A loaded model's shapes in a few words: seen of the plan, padding, recompiles. */
function shapesNote(m: {
  shape_plan?: z.infer<typeof ShapePlan> | null;
  shapes?: z.infer<typeof ShapesSeen>;
  compiles?: z.infer<typeof Compiles>;
}): string {
  if (!m.shape_plan || !m.shapes) return "";
  const waste = m.shapes.padding_waste;
  const pad = waste === null ? "" : `, padding ${(waste * 100).toFixed(0)}%`;
  const c = m.compiles;
  const compiled = c
    ? `, ${c.graphs_compiled ?? 0} graphs at load, ${c.recompiles_since_load} recompiles`
    : "";
  return `, shapes ${m.shapes.distinct_shapes}/${m.shape_plan.size}${pad}${compiled}`;
}

/** A loaded model's prefix cache in a few words: its hit rate and size. */
function prefixNote(p: PrefixCacheStatus | undefined): string {
  if (!p?.enabled) return "";
  const rate =
    typeof p.hit_rate === "number" ? `${(p.hit_rate * 100).toFixed(0)}% hits` : "no lookups";
  const size = typeof p.bytes === "number" ? `, ${(p.bytes / 2 ** 20).toFixed(1)} MiB` : "";
  return `, prefix cache ${rate}${size}`;
}

/** Errors that mean "no worker could answer": status reports them instead of failing. */
const UNAVAILABLE = new Set(["worker_unavailable", "worker_died", "timeout", "runtime_setting_up"]);

export const getRuntimeStatus: ToolFile = { policy, build };

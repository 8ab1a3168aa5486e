// /metrics with a Ray fleet: the fleet's target/observed gauges come from the fleet's state()
// (runtime/fleet/ray.ts fills it; the Ray e2e suite checks the real values in get_runtime_status).
import { describe, expect, it } from "vitest";
import { Metrics } from "../../server/app/metrics.js";
import type { FleetState, Runtime } from "../../runtime/types.js";

const fleet: FleetState = {
  state: "ready",
  address: "127.0.0.1:6379",
  mode: "per-chip",
  ray_version: "2.60.0",
  capacity: 4,
  target: 3,
  observed: 2,
  driver_restarts: 1,
  actor_restarts: 5,
  error: null,
  actors: [],
};

describe("fleet metrics", () => {
  it("exports target, observed, capacity, driver up and restarts", async () => {
    const m = new Metrics();
    m.observeWorkers({ single: false, workers: () => [] } as unknown as Runtime, () => fleet);
    const text = await m.registry.metrics();
    expect(text).toMatch(/^tpu_mcp_fleet_target_actors\{cluster="127\.0\.0\.1:6379"\} 3$/m);
    expect(text).toMatch(/^tpu_mcp_fleet_observed_actors\{cluster="127\.0\.0\.1:6379"\} 2$/m);
    expect(text).toMatch(/^tpu_mcp_fleet_capacity_actors\{cluster="127\.0\.0\.1:6379"\} 4$/m);
    expect(text).toMatch(/^tpu_mcp_fleet_driver_up\{cluster="127\.0\.0\.1:6379"\} 1$/m);
    expect(text).toMatch(/^tpu_mcp_fleet_driver_restarts\{cluster="127\.0\.0\.1:6379"\} 1$/m);
    expect(text).toMatch(/^tpu_mcp_fleet_actor_restarts\{cluster="127\.0\.0\.1:6379"\} 5$/m);
  });

  it("a pool without a fleet has no fleet series; an unknown target is left out", async () => {
    const m = new Metrics();
    m.observeWorkers({ single: false, workers: () => [] } as unknown as Runtime);
    expect(await m.registry.metrics()).not.toMatch(/tpu_mcp_fleet_/);
    const m2 = new Metrics();
    m2.observeWorkers({ single: false, workers: () => [] } as unknown as Runtime, () => ({
      ...fleet,
      state: "starting",
      target: null,
      capacity: null,
    }));
    const text = await m2.registry.metrics();
    expect(text).not.toMatch(/^tpu_mcp_fleet_target_actors\{cluster="127\.0\.0\.1:6379"\} \d/m);
    expect(text).toMatch(/^tpu_mcp_fleet_driver_up\{cluster="127\.0\.0\.1:6379"\} 0$/m);
  });
});

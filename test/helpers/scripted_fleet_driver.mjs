#!/usr/bin/env node
// A fleet driver that speaks tpu_worker/fleet/driver.py's line protocol without Ray, for the
// shared-fleet test on Postgres (test/postgres/shared_fleet.test.ts): the control plane's side
// (RayFleet, the shared store, the pools) is the real one; only the placement is scripted.
// Started as `DRIVER -m tpu_worker.fleet --config FILE`; SCRIPTED_FLEET_ACTORS actors, each
// "placed" at a port of its own for this run (a new run places them anew, as a new driver's
// actors are new ones). stdin closing ends it, as it ends the real driver.
import { createInterface } from "node:readline";

const count = Number(process.env.SCRIPTED_FLEET_ACTORS ?? 2);
const base = 20000 + (process.pid % 2000) * 8;
const emit = (m) => process.stdout.write(JSON.stringify(m) + "\n");
const actors = new Map();
let next = 0;

function place(i) {
  const name = `ray-${i}`;
  const a = {
    name,
    host: "127.0.0.1",
    port: base + i,
    certificate: `-----BEGIN CERTIFICATE-----\nrun ${process.pid} ${name}\n-----END CERTIFICATE-----\n`,
    device: "cpu",
    chips: [i],
    node: "node-1",
    pid: process.pid,
    serve_pid: process.pid,
    ray_name: `${name}@${process.pid}`,
    restarts: 0,
  };
  actors.set(name, a);
  next = Math.max(next, i + 1);
  emit({ type: "endpoint", ...a });
}

// SCRIPTED_FLEET_REFUSE: refuse at start, as the real driver does (one error line, exit 2).
if (process.env.SCRIPTED_FLEET_REFUSE) {
  emit({
    type: "error",
    code: "ray_auth_refused",
    message: "the Ray cluster refused this driver's token",
  });
  process.exit(2);
}

emit({
  type: "ready",
  ray_version: "scripted",
  mode: "per-chip",
  capacity: 4,
  nodes: 1,
  tpu_chips: 4,
  target: count,
});
for (let i = 0; i < count; i++) place(i);

createInterface({ input: process.stdin }).on("line", (line) => {
  const m = JSON.parse(line);
  if (m.op === "stop") process.exit(0);
  if (m.op === "status")
    emit({
      type: "reply",
      id: m.id,
      ok: true,
      result: {
        capacity: 4,
        actors: [...actors.values()].map((a) => ({
          name: a.name,
          ray_name: a.ray_name,
          state: a.state ?? "up",
          restarts: a.restarts,
          endpoint: {
            host: a.host,
            port: a.port,
            device: a.device,
            chips: a.chips,
            node: a.node,
            pid: a.pid,
          },
        })),
      },
    });
  if (m.op === "scale") {
    const live = [...actors.values()].filter((a) => a.state !== "draining");
    const added = [];
    const draining = [];
    for (let i = live.length; i < m.count; i++) {
      place(next);
      added.push(`ray-${next - 1}`);
    }
    for (const a of live.slice(m.count).reverse()) {
      a.state = "draining";
      draining.push(a.name);
    }
    emit({ type: "reply", id: m.id, ok: true, result: { target: m.count, added, draining } });
    for (const name of draining) emit({ type: "drain", name });
  }
  if (m.op === "drained" && actors.has(m.name)) {
    actors.delete(m.name);
    emit({ type: "removed", name: m.name });
  }
});
process.stdin.on("end", () => process.exit(0));

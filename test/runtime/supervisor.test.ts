// Supervision paths that need no Python: crash loops, closed runtimes, arguments refused
// before anything is sent.
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { RuntimeCallError } from "../../runtime/types.js";
import { cpuRuntime } from "./helpers.js";

const fastRestarts = {
  restartBackoffBaseMs: 5,
  restartBackoffMaxMs: 20,
  maxRestartsInWindow: 3,
  restartWindowMs: 60_000,
};

async function rejection(p: Promise<unknown>): Promise<RuntimeCallError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(RuntimeCallError);
    return e as RuntimeCallError;
  }
  throw new Error("expected a rejection");
}

describe("crash loops", () => {
  it("ends in state failed with worker_unavailable when the interpreter does not exist", async () => {
    const rt = cpuRuntime({ ...fastRestarts, pythonPath: "/nonexistent/python3" });
    const failed: string[] = [];
    const restarts: number[] = [];
    rt.on("failed", (i) => failed.push(i.reason));
    rt.on("restart", (i) => restarts.push(i.attempt));
    const err = await rejection(rt.call("describe", {}));
    expect(err.code).toBe("worker_unavailable");
    expect(err.recoverable).toBe(false);
    expect(err.message).toMatch(/tpu-mcp doctor/);
    expect(err.message).toMatch(/ENOENT/);
    expect(err.message).not.toMatch(/nonexistent/); // no paths in caller-facing messages
    expect(rt.state).toBe("failed");
    expect(failed).toHaveLength(1);
    expect(restarts).toEqual([1, 2, 3]);
    expect(rt.restarts()).toBe(3);
    // Later calls fail at once with the same explanation.
    expect((await rejection(rt.call("status", {}))).code).toBe("worker_unavailable");
    expect((await rejection(rt.ready())).code).toBe("worker_unavailable");
    await rt.close();
    expect(rt.state).toBe("stopped");
  });

  it("ends in state failed when the worker exits immediately, and start() retries", async () => {
    let spawned = 0;
    const rt = cpuRuntime({
      ...fastRestarts,
      spawn: (_cmd, _args, opts) => {
        spawned++;
        return spawn("/bin/sh", ["-c", "echo 'ModuleNotFoundError: no torch' >&2; exit 1"], opts);
      },
    });
    const err = await rejection(rt.start());
    expect(err.code).toBe("worker_unavailable");
    expect(err.message).toMatch(/crashed 4 times/);
    expect(spawned).toBe(4);
    expect(
      rt.logs.some((r) => r.source === "worker" && /ModuleNotFoundError/.test(String(r.msg))),
    ).toBe(true);
    // An explicit start() after `failed` is the operator's retry: it spawns again.
    expect((await rejection(rt.start())).code).toBe("worker_unavailable");
    expect(spawned).toBe(8);
    await rt.close();
  });
});

describe("calls refused before they reach a worker", () => {
  it("rejects a tensor whose bytes do not match its shape with invalid_argument", async () => {
    const rt = cpuRuntime({ pythonPath: "/nonexistent/python3" });
    const err = await rejection(
      rt.call(
        "infer",
        { model: "mnist-cnn" },
        { tensors: [{ dtype: "float32", shape: [2, 2], data: Buffer.alloc(4) }] },
      ),
    );
    expect(err.code).toBe("invalid_argument");
    expect(rt.state).toBe("stopped"); // nothing was spawned
    await rt.close();
  });

  it("rejects a call whose signal is already aborted with cancelled", async () => {
    const rt = cpuRuntime({ pythonPath: "/nonexistent/python3" });
    const err = await rejection(rt.call("status", {}, { signal: AbortSignal.abort() }));
    expect(err.code).toBe("cancelled");
    expect(rt.state).toBe("stopped");
    await rt.close();
  });

  it("rejects calls after close() with worker_unavailable", async () => {
    const rt = cpuRuntime({ pythonPath: "/nonexistent/python3" });
    await rt.close();
    const err = await rejection(rt.call("status", {}));
    expect(err.code).toBe("worker_unavailable");
    expect(err.message).toMatch(/shut down/);
  });
});

// Stray bytes on the worker's stdout (a C library or a stray print writing to fd 1 of a real
// worker). test/runtime covers the decoder frame by frame; this is the end-to-end consequence:
// the caller gets an answer or a clean error (never a hang), and the server recovers.
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ERROR_CATALOGUE } from "../../tools/errors.js";
import {
  baseConfig,
  cleanupTemp,
  errorOf,
  inProcess,
  LEAK_RE,
  PYTHON,
  pythonWrapper,
  recordFigure,
  tempDir,
  until,
} from "./helpers.js";

afterAll(() => cleanupTemp());

// Loaded into the real worker through sitecustomize: when the trigger file appears, writes its
// contents straight to fd 1, past the worker's framing.
const SITECUSTOMIZE = `
import os, threading, time
_PIPE = os.readlink("/proc/self/fd/1")  # the protocol pipe, before the worker moves fd 1 to stderr
def _proto_fd():
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        try:
            if fd != 1 and os.readlink(f"/proc/self/fd/{fd}") == _PIPE:
                return fd
        except OSError:
            pass
    return 1
def _inject():
    path = os.environ.get("TPU_HARDENING_TRIGGER")
    while path:
        if os.path.exists(path):
            with open(path, "rb") as fh:
                data = fh.read()
            os.remove(path)
            # S: write to fd 1 (a stray print); P: write into the protocol pipe itself.
            os.write(1 if data[:1] == b"S" else _proto_fd(), data[1:])
        time.sleep(0.05)
threading.Thread(target=_inject, daemon=True).start()
`;
import { scaled } from "../helpers/calibrate.js";

const CASES: [string, Buffer][] = [
  // Stray output on fd 1: the worker points fd 1 at stderr, so the protocol never sees it.
  ["S", "a stray print on fd 1", Buffer.from("Hello from a C library on stdout\n")],
  ["S", "0xff bytes on fd 1", Buffer.alloc(16, 0xff)],
  // Corruption of the protocol pipe itself.
  ["P", "a text line in the protocol pipe", Buffer.from("Hello from a C library on stdout\n")],
  ["P", "lengths of 0xffffffff in the protocol pipe", Buffer.alloc(16, 0xff)],
  [
    "P",
    "a frame with a non-JSON header",
    Buffer.concat([Buffer.from([0, 0, 0, 5, 0, 0, 0, 0]), Buffer.from("nope!")]),
  ],
  ["P", "a result for an id never sent", frame({ type: "result", id: "r999999", result: {} })],
].map(([k, what, b]) => [what as string, Buffer.concat([Buffer.from(k as string), b as Buffer])]);

function frame(header: unknown): Buffer {
  const h = Buffer.from(JSON.stringify(header));
  const pre = Buffer.alloc(8);
  pre.writeUInt32BE(h.length, 0);
  pre.writeUInt32BE(0, 4);
  return Buffer.concat([pre, h]);
}

describe("stray bytes on the worker's stdout", () => {
  it(
    "never leaves a caller hanging and the server recovers",
    { timeout: scaled(300_000) },
    async () => {
      const dir = tempDir();
      const inject = join(dir, "inject");
      mkdirSync(inject);
      writeFileSync(join(inject, "sitecustomize.py"), SITECUSTOMIZE);
      const trigger = join(dir, "trigger");
      const python = pythonWrapper(
        dir,
        `export PYTHONPATH="${inject}:$PYTHONPATH"\nexport TPU_HARDENING_TRIGGER="${trigger}"\nexec ${PYTHON} "$@"`,
      );
      const h = await inProcess(
        baseConfig(dir, { runtime: { python, heartbeat_interval_s: 1, heartbeat_timeout_s: 3 } }),
      );
      const seen: Record<string, string> = {};
      try {
        const c = await h.connect({ id: "t", scopes: ["admin"], via: "stdio" });
        const x = { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.1) };
        for (const [what, bytes] of CASES) {
          const loaded: any = await c.callTool({
            name: "load_model",
            arguments: { model: "mnist-cnn" },
          });
          expect(
            !loaded.isError || errorOf(loaded)!.code === "model_already_loaded",
            JSON.stringify(loaded).slice(0, 300),
          ).toBe(true);
          const restartsBefore = h.app.runtime.restarts();
          writeFileSync(trigger, bytes);
          await until(() => !existsSync(trigger), 10_000, 50);
          // Calls right after the corruption: each gets an answer or a clean error, in bounded time.
          for (let i = 0; i < 3; i++) {
            const t0 = Date.now();
            const r: any = await c.callTool(
              { name: "run_inference", arguments: { model: "mnist-cnn", tensors: [x] } },
              undefined,
              { timeout: scaled(60_000) },
            );
            expect(Date.now() - t0, what).toBeLessThan(scaled(30_000));
            if (r.isError) {
              expect(Object.keys(ERROR_CATALOGUE)).toContain(errorOf(r)!.code);
              expect(
                ["protocol_error", "worker_died", "model_not_loaded"],
                `${what}: ${errorOf(r)!.code}`,
              ).toContain(errorOf(r)!.code);
              expect(r.content[0].text).not.toMatch(LEAK_RE);
            }
            seen[`${what} #${i}`] = r.isError ? errorOf(r)!.code : "ok";
          }
          // Recovered: ready again, and a reload + inference works.
          await until(
            async () => {
              const s: any = await c.callTool({ name: "get_runtime_status", arguments: {} });
              return !s.isError && s.structuredContent.worker.state === "ready";
            },
            60_000,
            250,
          );
          // Stray prints on fd 1 never reach the protocol; a desynchronised pipe costs one restart.
          if (what.includes("fd 1")) expect(h.app.runtime.restarts(), what).toBe(restartsBefore);
          if (/text line in|0xffffffff in/.test(what))
            expect(h.app.runtime.restarts(), what).toBe(restartsBefore + 1);
          await c.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } });
          const ok: any = await c.callTool({
            name: "run_inference",
            arguments: { model: "mnist-cnn", tensors: [x] },
          });
          expect(ok.isError, `${what}: ${JSON.stringify(ok).slice(0, 300)}`).toBeFalsy();
        }
        recordFigure("worker_stdout_garbage", seen);
      } finally {
        await h.close();
      }
    },
  );
});

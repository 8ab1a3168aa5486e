// Memory stays flat under sustained traffic: the live heap after a full GC does not grow with the
// number of calls served (RSS alone cannot tell a leak from allocator headroom).
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { afterAll, describe, expect, it } from "vitest";
import { baseConfig, cleanupTemp, inProcess, recordFigure, tempDir } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;
const liveHeapMiB = () => {
  gc();
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
};

describe("memory under sustained traffic", () => {
  afterAll(() => cleanupTemp());

  it(
    "keeps the live heap flat over 12,000 inference calls from 16 concurrent callers",
    async () => {
      const srv = await inProcess(baseConfig(tempDir()));
      try {
        const client = await srv.connect({
          id: "local-user",
          scopes: ["models:load", "inference:run"],
          via: "stdio",
        });
        expect(
          (await client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } }))
            .isError,
        ).toBeFalsy();
        const x = Buffer.from(new Float32Array(784).fill(0.5).buffer).toString("base64");
        const args = {
          model: "mnist-cnn",
          tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data_b64: x }],
        };
        const round = async () => {
          await Promise.all(
            Array.from({ length: 16 }, async () => {
              for (let i = 0; i < 125; i++) {
                const r: any = await client.callTool({ name: "run_inference", arguments: args });
                if (r.isError) throw new Error(JSON.stringify(r.content));
              }
            }),
          );
        };
        await round(); // warm-up: caches, JIT, pools
        const samples = [liveHeapMiB()];
        for (let i = 0; i < 5; i++) {
          await round();
          samples.push(liveHeapMiB());
        }
        recordFigure(
          "live_heap_mib_every_2000_calls",
          samples.map((s) => Math.round(s * 10) / 10),
        );
        // 10,000 calls after warm-up: a per-call leak of even 200 bytes would add ~2 MiB.
        expect(samples.at(-1)! - samples[0]).toBeLessThan(2);
      } finally {
        await srv.close();
      }
    },
    scaled(600_000),
  );
});

// Issue 33, row 7: a cancelled 2025-era request's stream was never closed (still open after
// 90 s), keeping its session busy. The protocol sends no answer to a cancelled request, so the
// server now closes that request's stream once the cancellation reached the handler. A real
// server and worker, the SDK 1.x client over HTTP (its fetch wrapped only to see the stream end).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { startHttpServer, writeConfig, type HttpServerProc } from "../helpers/server.js";
import { until } from "../hardening/helpers.js";
import { scaled } from "../helpers/calibrate.js";

describe("a cancelled 2025-era request", () => {
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(writeConfig());
  }, scaled(180_000));
  afterAll(async () => server?.stop());

  it(
    "has its stream closed by the server, the session free for the next call",
    { timeout: scaled(300_000) },
    async () => {
      // Each tools/call POST's response stream: whether its body ended cleanly (the server closed it).
      const streams: { method: string; ended: boolean }[] = [];
      const watching: typeof fetch = async (input, init) => {
        const res = await fetch(input, init);
        const body = typeof init?.body === "string" ? init.body : "";
        if (!res.body || !body.includes('"tools/call"')) return res;
        const seen = { method: "tools/call", ended: false };
        streams.push(seen);
        const counted = res.body.pipeThrough(
          new TransformStream({ flush: () => void (seen.ended = true) }),
        );
        return new Response(counted, { status: res.status, headers: res.headers });
      };
      const transport = new StreamableHTTPClientTransport(new URL(server.url), {
        requestInit: { headers: { Authorization: `Bearer ${server.token}` } },
        fetch: watching,
      });
      const client = new Client({ name: "cancel-test", version: "0.0.0" });
      await client.connect(transport);
      try {
        await client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } });
        const ac = new AbortController();
        let progressed!: () => void;
        const running = new Promise<void>((r) => (progressed = r));
        const call = client
          .callTool(
            {
              name: "run_benchmark",
              arguments: { model: "mnist-cnn", batch_sizes: [1], duration_s: 40, warmup: 0 },
            },
            undefined,
            { signal: ac.signal, onprogress: () => progressed(), timeout: scaled(300_000) },
          )
          .catch((e: unknown) => e);
        await running; // the benchmark is running in the worker
        ac.abort("the user pressed stop");
        await call;
        const bench = streams[streams.length - 1]!;
        // Closed by the server long before the benchmark's 40 s would have ended it.
        await until(() => bench.ended, 30_000);
        expect(bench.ended).toBe(true);
        // The session serves the next call.
        const status = await client.callTool({ name: "get_runtime_status", arguments: {} });
        expect(status.isError).toBeFalsy();
      } finally {
        await client.close();
      }
    },
  );
});

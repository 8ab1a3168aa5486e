// Issue 23, item 5: a webhook's console link uses the configured public `http.resource_url`,
// not the address the server is bound to (127.0.0.1 behind a proxy is nobody's console). A real
// server and a real receiver on loopback.
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { publicConsoleUrl } from "../../server/app/app.js";
import {
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

describe("webhook console links", () => {
  const bodies: any[] = [];
  let rx: Server;
  let server: HttpServerProc;

  beforeAll(async () => {
    rx = createServer(async (req, res) => {
      let raw = "";
      for await (const c of req) raw += c;
      bodies.push(JSON.parse(raw));
      res.writeHead(200).end();
    });
    await new Promise<void>((r) => rx.listen(0, "127.0.0.1", () => r()));
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-notify-url-"));
    writeFileSync(join(dir, "webhook.secret"), "whsec-public-url-0123456789\n", { mode: 0o600 });
    const config = writeConfig(
      {
        runtime: { device: "cpu", start: "lazy" },
        http: { resource_url: "https://tpu.example.com/ml/mcp" },
        policy: {
          ...DEMO_POLICY,
          approvals: {
            rules: [{ tool: "list_models" }],
            elicitation: false,
            notify: [
              {
                url: `http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`,
                secret_file: "webhook.secret",
                events: ["requested"],
              },
            ],
          },
        },
      },
      dir,
    );
    server = await startHttpServer(config);
  }, scaled(120_000));

  afterAll(async () => {
    await server?.stop();
    await new Promise<void>((r) => (rx ? rx.close(() => r()) : r()));
  });

  it(
    "point at the public resource_url's console, not the bound address",
    { timeout: scaled(60_000) },
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      const r = await agent.client.callTool({ name: "list_models", arguments: {} });
      expect(errorOf(r)?.code).toBe("approval_required");
      await agent.close();
      const end = Date.now() + 30_000;
      while (bodies.length === 0 && Date.now() < end) await new Promise((f) => setTimeout(f, 50));
      expect(bodies).toHaveLength(1);
      expect(bodies[0].console_url).toBe("https://tpu.example.com/ml/console/");
      expect(bodies[0].text).toContain("https://tpu.example.com/ml/console/");
      expect(JSON.stringify(bodies[0])).not.toMatch(/127\.0\.0\.1/);
    },
  );

  it("derive the console URL from resource_url's path", () => {
    expect(publicConsoleUrl(undefined)).toBeUndefined();
    expect(publicConsoleUrl("https://tpu.example.com/mcp")).toBe(
      "https://tpu.example.com/console/",
    );
    expect(publicConsoleUrl("https://tpu.example.com/mcp/")).toBe(
      "https://tpu.example.com/console/",
    );
    expect(publicConsoleUrl("https://tpu.example.com")).toBe("https://tpu.example.com/console/");
    expect(publicConsoleUrl("https://h.example:8443/a/b/mcp?x=1")).toBe(
      "https://h.example:8443/a/b/console/",
    );
  });
});

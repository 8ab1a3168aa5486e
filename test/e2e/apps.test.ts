// MCP Apps negotiation over stdio: only a client that advertises io.modelcontextprotocol/ui gets
// `_meta.ui` on tools and approval results and sees the ui:// views; the text stays complete.
// (The view itself is drawn in chromium by the browser suite.)
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig, DEMO_POLICY } from "../helpers/server.js";

const UI = "io.modelcontextprotocol/ui";
const MIME = "text/html;profile=mcp-app";
const ARGS = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 0 };

describe("MCP Apps", () => {
  const config = writeConfig({ policy: DEMO_POLICY });
  let withUi: Awaited<ReturnType<typeof connectStdio>>;
  let plain: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    withUi = await connectStdio(config, {
      capabilities: { extensions: { [UI]: { mimeTypes: [MIME] } } } as any,
    });
    plain = await connectStdio(config);
  });
  afterAll(async () => {
    await withUi?.close();
    await plain?.close();
  });

  it("links the benchmark view on run_benchmark and get_job for a client with the extension", async () => {
    const tools = (await withUi.client.listTools()).tools;
    const meta = (name: string) => (tools.find((t) => t.name === name)?._meta as any)?.ui;
    expect(meta("run_benchmark")).toEqual({ resourceUri: "ui://tpu-mcp/benchmark-view.html" });
    expect(meta("get_job")).toEqual({ resourceUri: "ui://tpu-mcp/benchmark-view.html" });
    expect(meta("run_inference")).toBeUndefined();
    expect((withUi.client.getServerCapabilities() as any)?.extensions?.[UI]).toEqual({
      elicitation: {},
    });

    const listed = (await withUi.client.listResources()).resources.filter((r) =>
      r.uri.startsWith("ui://"),
    );
    expect(listed.map((r) => [r.uri, r.mimeType])).toEqual([
      ["ui://tpu-mcp/benchmark-view.html", MIME],
      ["ui://tpu-mcp/approval-card.html", MIME],
    ]);
    const doc = (await withUi.client.readResource({ uri: "ui://tpu-mcp/benchmark-view.html" }))
      .contents[0] as any;
    expect(doc.mimeType).toBe(MIME);
    expect(doc.text).toMatch(/^<!doctype html>/);
    // Self-contained: no external script, stylesheet or URL for the default CSP to block.
    expect(doc.text).not.toMatch(/<script[^>]+src=|<link[^>]+href=|https?:\/\//i);
    expect(doc.text).toContain("ui/initialize");
  });

  it("links the approval card on approval_required, keeping the text complete", async () => {
    const r = await withUi.client.callTool({ name: "run_benchmark", arguments: ARGS });
    expect(errorOf(r)?.code).toBe("approval_required");
    expect((r._meta as any).ui).toEqual({ resourceUri: "ui://tpu-mcp/approval-card.html" });
    expect(errorOf(r)?.details).toMatchObject({
      tool: "run_benchmark",
      args: { model: "mnist-cnn" },
    });
    // The command runs from any folder (absolute bin, the server's --config); over stdio the
    // card and the text say how to serve a console on the same data.
    const d = errorOf(r)?.details as any;
    expect(d.approve_command).toMatch(
      /^node \/\S+\/bin\/tpu-mcp\.js approvals approve apr_\w+ --config \/\S+$/,
    );
    expect(d.console_command).toMatch(/^node \/\S+\/bin\/tpu-mcp\.js http --config \/\S+$/);
    expect((r.content as any)[0].text).toContain(d.approve_command);
    expect((r.content as any)[0].text).toContain(d.console_command);
  });

  it("adds nothing for a client without the extension", async () => {
    const tools = (await plain.client.listTools()).tools;
    expect(tools.every((t) => t._meta === undefined)).toBe(true);
    const resources = (await plain.client.listResources()).resources;
    expect(resources.some((r) => r.uri.startsWith("ui://"))).toBe(false);
    const r = await plain.client.callTool({ name: "run_benchmark", arguments: ARGS });
    expect(errorOf(r)?.code).toBe("approval_required");
    expect((r._meta as any).ui).toBeUndefined();
  });
});

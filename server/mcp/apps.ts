// MCP Apps (the io.modelcontextprotocol/ui extension, 2026-01-26), written by hand: SDK 1.32 has
// no helper and ext-apps 2.x needs SDK v2. When a client advertises the extension, tools that
// declare a view (run_benchmark, get_job) carry `_meta.ui.resourceUri` in tools/list, the view is
// listed as a `text/html;profile=mcp-app` resource, and an approval_required result links the
// same document as an informational status card. Clients without the extension see nothing new;
// every result's text content is complete on its own.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

export const UI_EXTENSION = "io.modelcontextprotocol/ui";
export const UI_MIME = "text/html;profile=mcp-app";
export const BENCHMARK_VIEW_URI = "ui://tpu-mcp/benchmark-view.html";
export const APPROVAL_CARD_URI = "ui://tpu-mcp/approval-card.html";
const VIEWS = [
  {
    uri: BENCHMARK_VIEW_URI,
    name: "benchmark-view",
    title: "Benchmark report view (latency percentiles and throughput against batch size)",
  },
  {
    uri: APPROVAL_CARD_URI,
    name: "approval-card",
    title: "Approval status card (information only; operators approve out of band)",
  },
];

/** Does the client render MCP Apps? (capabilities.extensions[UI_EXTENSION].mimeTypes) */
export function clientSupportsUi(caps: Record<string, any> | undefined): boolean {
  const ext = caps?.extensions?.[UI_EXTENSION];
  if (!ext || typeof ext !== "object") return false;
  const types = (ext as { mimeTypes?: unknown }).mimeTypes;
  return !Array.isArray(types) || types.includes(UI_MIME);
}

export function uiResources() {
  return VIEWS.map((v) => ({ ...v, mimeType: UI_MIME }));
}

let cached: { file: string; html: string } | undefined;

/** The built view (dist/console/mcp-app.html), one self-contained document for both URIs. */
export function readUiResource(root: string, uri: string) {
  if (!VIEWS.some((v) => v.uri === uri)) return undefined;
  const file = join(root, "dist", "console", "mcp-app.html");
  if (!cached || cached.file !== file) {
    if (!existsSync(file))
      throw new Error("the MCP App view is not built; run `npm run setup` on the server");
    cached = { file, html: readFileSync(file, "utf8") };
  }
  return {
    contents: [
      {
        uri,
        mimeType: UI_MIME,
        text: cached.html,
        // Needs nothing beyond the extension's default CSP: no network, no other origin.
        _meta: { ui: { prefersBorder: true } },
      },
    ],
  };
}

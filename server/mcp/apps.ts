// MCP Apps (the io.modelcontextprotocol/ui extension, 2026-01-26), with the official ext-apps
// helpers for its names and the client's capability (the low-level Server registers the views
// itself: ext-apps' registerAppTool needs the high-level McpServer). When a client advertises the
// extension (per session in the 2025 era, per request in 2026-07-28), tools that
// declare a view (run_benchmark, get_job) carry `_meta.ui.resourceUri` in tools/list, the view is
// listed as a `text/html;profile=mcp-app` resource, and an approval_required result links the
// same document as an informational status card. Clients without the extension see nothing new;
// every result's text content is complete on its own.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  EXTENSION_ID,
  getUiCapability,
  RESOURCE_MIME_TYPE,
} from "@modelcontextprotocol/ext-apps/server";
import { APPROVAL_CARD_URI, BENCHMARK_VIEW_URI } from "../../lib/views.js";

export const UI_EXTENSION = EXTENSION_ID;
export const UI_MIME = RESOURCE_MIME_TYPE;
export { APPROVAL_CARD_URI, BENCHMARK_VIEW_URI };
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
  const ext = getUiCapability(caps);
  if (!ext || typeof ext !== "object") return false;
  const types = (ext as { mimeTypes?: unknown }).mimeTypes;
  return !Array.isArray(types) || types.includes(UI_MIME);
}

/**
 * App-rendered elicitation (SEP-3118, draft): the client renders an MCP App in place of a form
 * elicitation's native form when it declares form elicitation, the extension's MIME type and
 * `elicitation` inside the extension (the server declares the same `elicitation` beside it).
 */
export function clientRendersFormApps(caps: Record<string, any> | undefined): boolean {
  const ext = getUiCapability(caps) as { elicitation?: unknown } | undefined;
  const form = (caps?.elicitation as { form?: unknown } | undefined)?.form;
  const declared = typeof ext?.elicitation === "object" && ext.elicitation !== null;
  return clientSupportsUi(caps) && declared && form !== undefined;
}

/** The server's side of the extension: its views, and app-rendered approval forms. */
export const UI_SERVER_CAPABILITY = { elicitation: {} };

/** The `_meta` that routes an approval form to the approval card, for a client that renders it. */
export function approvalFormMeta(caps: Record<string, any> | undefined) {
  return clientRendersFormApps(caps) ? { _meta: { ui: { resourceUri: APPROVAL_CARD_URI } } } : {};
}

export function uiResources() {
  return VIEWS.map((v) => ({ ...v, mimeType: UI_MIME }));
}

let cached: { file: string; html: string } | undefined;

/** The built view (dist/console/mcp-app.html), one self-contained document for both URIs. */
export function readUiResource(assetDir: string, uri: string) {
  if (!VIEWS.some((v) => v.uri === uri)) return undefined;
  const file = join(assetDir, "mcp-app.html");
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

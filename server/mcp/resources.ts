// The tpu:// resources (model catalog, benchmark reports, full output tensors) and the ui:// views
// of MCP Apps: listing, templates and reads, for one session's principal.
import {
  ProtocolError,
  ProtocolErrorCode,
  type Server,
  type ServerContext,
} from "@modelcontextprotocol/server";
import { hasScope, type Principal } from "../../policies/scopes.js";
import { renderReportSvg } from "../../tools/render/report_chart.js";
import { renderReportMarkdown } from "../../tools/render/report_format.js";
import type { App } from "../app/app.js";
import { readUiResource, uiResources } from "./apps.js";
import { tracedRequest } from "./request_span.js";

/** `ui(ctx)`: whether the requesting client shows MCP Apps views (asked per request: it is known
 * only after initialize). */
export function registerResources(
  server: Server,
  app: App,
  principal: Principal,
  ui: (ctx: ServerContext) => boolean,
  era: "legacy" | "modern" = "legacy",
): void {
  server.setRequestHandler("resources/list", (req, ctx) =>
    tracedRequest(server, ctx, era, req.params?._meta, async () => {
      const views = ui(ctx) ? uiResources() : [];
      if (!hasScope(principal, "models:read")) return { resources: views };
      const reports = (await app.reports.list(20)).map((r) => ({
        uri: `tpu://benchmarks/${r.id}`,
        name: `benchmark ${r.id}`,
        title: `Benchmark of ${r.model} on ${r.device} (${r.created_at})`,
        mimeType: "application/json",
      }));
      const outputs = (await app.outputs.list(principal.id)).flatMap((o) =>
        o.tensors.map((_t, i) => ({
          uri: `tpu://outputs/${o.id}/${i}`,
          name: `output ${o.id}/${i}`,
          mimeType: "application/json",
        })),
      );
      return {
        resources: [
          {
            uri: "tpu://models",
            name: "models",
            title: "Model catalog",
            mimeType: "application/json",
          },
          ...reports,
          ...outputs,
          ...views,
        ],
      };
    }),
  );

  server.setRequestHandler("resources/templates/list", (req, ctx) =>
    tracedRequest(server, ctx, era, req.params?._meta, async () => ({
      resourceTemplates: [
        {
          uriTemplate: "tpu://benchmarks/{id}",
          name: "benchmark",
          title: "A benchmark report (JSON)",
          mimeType: "application/json",
        },
        {
          uriTemplate: "tpu://benchmarks/{id}.md",
          name: "benchmark-markdown",
          title: "A benchmark report (Markdown)",
          mimeType: "text/markdown",
        },
        {
          uriTemplate: "tpu://benchmarks/{id}.svg",
          name: "benchmark-chart",
          title: "A benchmark report's latency and throughput against batch size (SVG)",
          mimeType: "image/svg+xml",
        },
        {
          uriTemplate: "tpu://outputs/{id}/{index}",
          name: "output",
          title: "A full inference output tensor",
          mimeType: "application/json",
        },
      ],
    })),
  );

  server.setRequestHandler("resources/read", (req, ctx) =>
    tracedRequest(server, ctx, era, req.params?._meta, async () => {
      const uri = req.params.uri;
      // 2026-07-28 made "not found" an invalid-params error; the 2025 era keeps its own code.
      const notFound = () =>
        new ProtocolError(
          era === "modern" ? ProtocolErrorCode.InvalidParams : -32002,
          `Resource not found: ${uri.slice(0, 200)}`,
          { uri: uri.slice(0, 2000) },
        );
      // The views hold no data (results reach them from the host), so any session may read them.
      if (uri.startsWith("ui://")) {
        const view = readUiResource(app.config.paths.install.consoleAssets, uri);
        if (!view) throw notFound();
        return view as any;
      }
      if (!hasScope(principal, "models:read") && !uri.startsWith("tpu://outputs/"))
        throw notFound();
      if (uri === "tpu://models") {
        const facts = await app.facts.all().catch(() => new Map());
        const models = app.catalog.models.map((m) => ({ ...m, ...(facts.get(m.id) ?? {}) }));
        // Paths stay inside the server.
        const text = JSON.stringify(
          { models: models.map(({ source: _s, ...rest }) => rest) },
          null,
          2,
        );
        return { contents: [{ uri, mimeType: "application/json", text }] };
      }
      let m = /^tpu:\/\/benchmarks\/(bench_[0-9a-f]{20})(\.md|\.svg)?$/.exec(uri);
      if (m) {
        const r = await app.reports.get(m[1]);
        if (!r) throw notFound();
        if (m[2] === ".svg")
          return {
            contents: [{ uri, mimeType: "image/svg+xml", text: renderReportSvg(r.report) }],
          };
        if (m[2])
          return {
            contents: [{ uri, mimeType: "text/markdown", text: renderReportMarkdown(r.report) }],
          };
        return {
          contents: [
            { uri, mimeType: "application/json", text: JSON.stringify(r.report, null, 2) },
          ],
        };
      }
      m = /^tpu:\/\/outputs\/(out_[0-9a-f]{24})\/(\d{1,2})$/.exec(uri);
      if (m) {
        const o = await app.outputs.get(m[1], principal.id);
        const t = o?.tensors[Number(m[2])];
        if (!t) throw notFound();
        const text = JSON.stringify({
          dtype: t.dtype,
          shape: t.shape,
          byte_order: "little",
          data_b64: t.data.toString("base64"),
        });
        return { contents: [{ uri, mimeType: "application/json", text }] };
      }
      throw notFound();
    }),
  );
}

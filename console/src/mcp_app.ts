// The MCP App view (ui://tpu-mcp/benchmark-view.html): one self-contained document the host
// renders in a sandboxed iframe. It speaks the extension's JSON-RPC over postMessage
// (ui/initialize → ui/notifications/initialized, then the host's tool-input / tool-result
// notifications) and draws what the tool returned: a benchmark report, a job's state, or an
// informational approval card. It never calls tools: approval stays with the operator.
import { compactJson, drawReports, reportTable, trainTable, type Report } from "./chart.js";
import { unstableNote } from "./report_data.js";
import "./mcp_app.css";

type Json = Record<string, any>;
const PROTOCOL_VERSION = "2026-01-26";
const root = () => document.getElementById("app")!;
let nextId = 1;
const pending = new Map<number, (r: Json) => void>();

function post(msg: Json) {
  window.parent.postMessage({ jsonrpc: "2.0", ...msg }, "*");
}

function request(method: string, params: Json): Promise<Json> {
  const id = nextId++;
  post({ id, method, params });
  return new Promise((resolve) => pending.set(id, resolve));
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  text?: string,
  cls?: string,
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function reportSize() {
  const r = document.documentElement.getBoundingClientRect();
  post({
    method: "ui/notifications/size-changed",
    params: { width: Math.ceil(r.width), height: Math.ceil(r.height) },
  });
}

function renderReport(report: Report) {
  const m = report.manifest ?? {};
  const device = typeof m.device === "object" ? m.device?.kind : (m.device ?? "?");
  const box = root();
  box.replaceChildren(
    el("h1", `${report.model ?? "?"} on ${device}${m.device_name ? ` (${m.device_name})` : ""}`),
    el(
      "p",
      `report ${report.report_id ?? "?"} · ${report.scenario ?? ""} · ${report.work ?? "forward"}` +
        `${report.cancelled ? " · cancelled (partial)" : ""}` +
        `${report.stopped ? ` · stopped (${report.stopped}): partial` : ""} · torch ${m.torch_version ?? "?"} · warmup not counted`,
      "meta",
    ),
  );
  const charts = el("div", undefined, "charts");
  charts.id = "charts";
  box.append(charts);
  drawReports(charts, [{ label: "report", report }]);
  const wrap = el("div", undefined, "scroll");
  wrap.append(
    report.work === "train_step" ? trainTable(report) : reportTable([{ label: "report", report }]),
  );
  box.append(wrap);
  const unstable = ((report.configs ?? []) as Json[]).filter((c) => !c.error && unstableNote(c));
  if (unstable.length) {
    const list = el("ul", undefined, "warn unstable");
    for (const c of unstable)
      list.append(
        el(
          "li",
          `batch ${c.batch}${c.seq_len ? ` seq ${c.seq_len}` : ""} ${c.dtype} ${c.mode}: ${unstableNote(c)}`,
        ),
      );
    box.append(list);
  }
  const cmp = report.comparison;
  if (cmp?.ratios?.length) {
    const list = el("ul", undefined, "comparison");
    for (const r of cmp.ratios as Json[])
      list.append(
        el(
          "li",
          `vs ${cmp.baseline_id}, batch ${r.batch}${r.seq_len ? ` seq ${r.seq_len}` : ""} ${r.dtype} ${r.mode}: p50 ×${Number(r.p50_ratio).toFixed(3)}` +
            (r.p50_ratio_ci
              ? ` (${r.p50_ratio_ci[0].toFixed(3)}–${r.p50_ratio_ci[1].toFixed(3)}): ${r.difference}`
              : `: ${r.difference ?? "no interval"}`),
        ),
      );
    box.append(list);
  }
  const warnings: string[] = cmp?.warnings ?? [];
  if (warnings.length) box.append(el("p", `vs ${cmp.baseline_id}: ${warnings.join("; ")}`, "warn"));
}

/** The operator's command as the server built it for its install, --home and --config. */
function approveCommand(d: Json): string {
  return String(d.approve_command ?? `tpu-mcp approvals approve ${d.approval_id ?? "<id>"}`);
}

/** Where the console is: this approval's page, the console, or how to serve one (stdio). */
function consoleWhere(d: Json): string {
  const link = d.approval_url ?? d.console_url;
  if (link) return `in the tpu-mcp console (${link})`;
  if (d.console_command)
    return `in a tpu-mcp console (start one on this server's data with \`${d.console_command}\`)`;
  return "";
}

function renderApproval(err: Json) {
  const d = err.details ?? {};
  // The request as the operator is shown it (the server's one payload), where the server sent it.
  const shown = d.shown ?? {
    tool: d.tool,
    approval_id: d.approval_id,
    estimate: d.estimate,
    args: d.args,
  };
  const box = root();
  const dl = el("dl");
  const row = (k: string, v: string) => dl.append(el("dt", k), el("dd", v));
  row("Tool", String(shown.tool ?? "?"));
  row("Approval id", String(shown.approval_id ?? "?"));
  if (shown.rule) row("Rule", String(shown.rule));
  const e = shown.estimate;
  row(
    "Estimate",
    e
      ? `${e.device_seconds} device-s${e.cost ? ` (~${e.cost.amount} ${e.cost.currency})` : ""}, ${Math.round((e.memory_bytes ?? 0) / 2 ** 20)} MiB memory`
      : "none",
  );
  row("Expires", d.expires_at ? new Date(d.expires_at).toLocaleString() : "?");
  const passkey = d.assurance === "passkey";
  row(
    "Decision needs",
    passkey
      ? "an operator's passkey (in the console)"
      : d.assurance === "client_form"
        ? "an operator token, or whoever answers the client's form"
        : "an operator token",
  );
  const args = el("pre", compactJson(shown.args ?? {}), "args");
  box.replaceChildren(
    el("h1", "Waiting for an operator's approval"),
    dl,
    el("p", "Arguments (redacted fields are summaries):", "meta"),
    args,
    el(
      "p",
      (passkey
        ? `An operator approves in the tpu-mcp console${d.approval_url ? ` (${d.approval_url})` : ""}, signing with a passkey; a token or the command line cannot. `
        : `An operator approves ${consoleWhere(d) ? `${consoleWhere(d)} or ` : ""}with \`${approveCommand(d)}\`, run from any folder. `) +
        "This card is information only: it cannot approve anything. Then call the tool again with the same arguments and approval_id.",
      "note",
    ),
  );
  box.dataset.kind = "approval";
}

function renderResult(result: Json) {
  const sc = result?.structuredContent;
  const err = result?._meta?.["tpu-mcp/error"];
  if (err?.code === "approval_required") return renderApproval(err);
  if (sc && Array.isArray(sc.configs)) {
    root().dataset.kind = "report";
    return renderReport(sc);
  }
  if (sc && sc.job_id) {
    if (sc.status === "succeeded" && sc.result && Array.isArray(sc.result.configs)) {
      root().dataset.kind = "report";
      return renderReport(sc.result);
    }
    root().dataset.kind = "job";
    root().replaceChildren(
      el("h1", `Job ${sc.job_id}: ${sc.status}`),
      el(
        "p",
        sc.error
          ? `${sc.error.code}: ${sc.error.message}`
          : (sc.message ?? "Call get_job again for progress; a finished benchmark is drawn here."),
        "meta",
      ),
    );
    return;
  }
  root().dataset.kind = "text";
  const text = (result?.content ?? [])
    .filter((c: Json) => c.type === "text")
    .map((c: Json) => c.text)
    .join("\n");
  root().replaceChildren(el("pre", text || "No result to show.", "args"));
}

window.addEventListener("message", (ev) => {
  if (ev.source !== window.parent) return;
  const msg = ev.data as Json;
  if (!msg || msg.jsonrpc !== "2.0") return;
  if (msg.id !== undefined && !msg.method) {
    pending.get(msg.id)?.(msg.result ?? {});
    pending.delete(msg.id);
    return;
  }
  try {
    if (msg.method === "ui/notifications/tool-input") {
      const a = msg.params?.arguments ?? {};
      root().replaceChildren(
        el("p", `Running ${a.model ? `a benchmark of ${a.model}` : "the tool"}…`, "meta"),
      );
    } else if (msg.method === "ui/notifications/tool-result") {
      renderResult(msg.params ?? {});
    } else if (msg.method === "ui/resource-teardown" && msg.id !== undefined) {
      post({ id: msg.id, result: {} });
      return;
    } else if (msg.id !== undefined) {
      post({ id: msg.id, error: { code: -32601, message: `method not found: ${msg.method}` } });
      return;
    }
  } catch (e) {
    root().replaceChildren(el("p", `Could not render the result: ${(e as Error).message}`, "warn"));
  }
  requestAnimationFrame(reportSize);
});

void request("ui/initialize", {
  protocolVersion: PROTOCOL_VERSION,
  appInfo: { name: "tpu-mcp benchmark view", version: "0.1.0" },
  appCapabilities: {},
}).then(() => {
  post({ method: "ui/notifications/initialized", params: {} });
});

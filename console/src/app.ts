// The operator console (served at /console). No framework: a few DOM helpers, hash routes, and
// fetch calls to /console/api. The CSRF token lives in this module's memory only; the session
// itself is an HttpOnly cookie this script cannot read.
import { compactJson, drawReports, reportTable, type Report } from "./chart.js";
import "./style.css";

type Json = Record<string, any>;
type Child = Node | string | null | undefined | false;

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | boolean | ((e: Event) => void)> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else if (v === true) el.setAttribute(k, "");
    else if (v !== false) el.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) el.append(c);
  return el;
}

let csrf = "";
let me: Json | null = null;
let events: EventSource | null = null;
let cleanup: (() => void)[] = [];
const main = () => document.getElementById("main")!;

class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

async function api(path: string, init: { method?: string; body?: unknown } = {}): Promise<Json> {
  const res = await fetch(`/console/api/${path}`, {
    method: init.method ?? "GET",
    credentials: "same-origin",
    headers: {
      ...(init.body !== undefined ? { "content-type": "application/json" } : {}),
      ...(init.method && init.method !== "GET" && csrf ? { "x-csrf-token": csrf } : {}),
    },
    body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
  });
  const data = (await res.json().catch(() => ({}))) as Json;
  if (!res.ok) {
    if (res.status === 401 && path !== "session") showSignIn("Your session ended; sign in again.");
    throw new ApiError(
      res.status,
      data.error?.code ?? "error",
      data.error?.message ?? res.statusText,
    );
  }
  return data;
}

/** Local time as YYYY-MM-DD HH:MM:SS (unambiguous in every locale). */
function when(iso: string | null | undefined): string {
  if (!iso) return "–";
  const d = new Date(iso);
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function countdown(iso: string): string {
  const s = Math.round((Date.parse(iso) - Date.now()) / 1000);
  if (s <= 0) return "expired";
  const m = Math.floor(s / 60);
  return m >= 60 ? `${Math.floor(m / 60)} h ${m % 60} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}

function bytes(n: number | null | undefined): string {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function estimateText(e: Json | null): string {
  if (!e) return "no estimate";
  return [
    `${e.device_seconds} device-s`,
    `${bytes(e.memory_bytes)} memory`,
    e.weight_bytes ? `${bytes(e.weight_bytes)} weights` : "",
    e.compile_s ? `${e.compile_s} s compile` : "no compile",
  ]
    .filter(Boolean)
    .join(" · ");
}

function status(text: string, kind: "ok" | "bad" | "info" = "info") {
  return h("p", { class: `status ${kind}`, role: kind === "bad" ? "alert" : "status" }, text);
}

function table(headers: string[], rows: Child[][], label: string): HTMLElement {
  return h(
    "div",
    { class: "scroll", tabindex: "0", role: "region", "aria-label": label },
    h(
      "table",
      { class: "data" },
      h("thead", {}, h("tr", {}, ...headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))),
    ),
  );
}

// ---- sign-in ---------------------------------------------------------------------------------

function showSignIn(message = "") {
  stopPage();
  events?.close();
  events = null;
  me = null;
  csrf = "";
  document.getElementById("who")!.replaceChildren();
  document.getElementById("nav")!.hidden = true;
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const err = h("p", { class: "status bad", role: "alert", id: "signin-error" }, message);
  const form = h(
    "form",
    { class: "card signin", id: "signin" },
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      "Paste an operator token (one that holds approvals:grant or admin). It is exchanged for a session cookie and is not kept by this page.",
    ),
    h("label", { for: "token" }, "Operator token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    err,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value;
    input.value = "";
    try {
      const s = await api("session", { method: "POST", body: { token } });
      start(s);
    } catch (x) {
      err.textContent = (x as Error).message;
      input.focus();
    }
  });
  main().replaceChildren(form);
  input.focus();
}

async function signOut() {
  try {
    await api("session", { method: "DELETE" });
  } finally {
    showSignIn("Signed out.");
  }
}

function start(session: Json) {
  me = session;
  csrf = session.csrf;
  document.getElementById("nav")!.hidden = false;
  document
    .getElementById("who")!
    .replaceChildren(
      h("span", {}, `${session.principal}${session.admin ? " (admin)" : ""}`),
      h("button", { type: "button", class: "link", id: "signout", onclick: signOut }, "Sign out"),
    );
  events?.close();
  events = new EventSource("/console/api/events");
  events.addEventListener("approval", (e) => {
    const data = JSON.parse((e as MessageEvent).data);
    window.dispatchEvent(new CustomEvent("approval", { detail: data }));
  });
  if (!location.hash || location.hash === "#") location.hash = "#/approvals";
  else route();
}

// ---- pages -----------------------------------------------------------------------------------

function stopPage() {
  for (const f of cleanup) f();
  cleanup = [];
}

function every(ms: number, fn: () => void): () => void {
  const t = setInterval(fn, ms);
  const stop = () => clearInterval(t);
  cleanup.push(stop);
  return stop;
}

function on(type: string, fn: (e: Event) => void) {
  window.addEventListener(type, fn);
  cleanup.push(() => window.removeEventListener(type, fn));
}

function approvalCard(a: Json, refresh: () => void): HTMLElement {
  const reason = h("input", {
    type: "text",
    id: `reason-${a.id}`,
    placeholder: "reason (shown to the agent)",
    maxlength: "500",
  });
  const msg = h("p", { class: "status", role: "status" });
  const decide = async (decision: "approve" | "deny") => {
    try {
      await api(`approvals/${a.id}/${decision}`, {
        method: "POST",
        body: decision === "deny" ? { reason: reason.value } : {},
      });
      msg.textContent = decision === "approve" ? "Approved." : "Denied.";
      refresh();
    } catch (x) {
      msg.className = "status bad";
      msg.setAttribute("role", "alert");
      msg.textContent = `${(x as ApiError).code}: ${(x as Error).message}`;
    }
  };
  const self = !a.can_decide;
  const expires = h(
    "span",
    { class: "countdown", "data-expires": a.expires_at },
    countdown(a.expires_at),
  );
  return h(
    "article",
    { class: "card approval", "data-id": a.id, "aria-label": `approval ${a.id}` },
    h(
      "header",
      {},
      h("h3", {}, h("span", { class: "principal" }, a.principal), " → ", h("code", {}, a.tool)),
      h("span", { class: "expiry" }, "expires in ", expires),
    ),
    h(
      "dl",
      {},
      h("dt", {}, "Estimate"),
      h("dd", {}, estimateText(a.estimate)),
      h("dt", {}, "Requested"),
      h("dd", {}, when(a.created_at)),
      h("dt", {}, "Who else can decide"),
      h("dd", {}, a.deciders.length ? a.deciders.join(", ") : "nobody else holds approvals:grant"),
      h("dt", {}, "Request id"),
      h("dd", {}, h("code", {}, a.id)),
    ),
    h("p", { class: "label" }, "Exact arguments (redacted fields are summaries, as in the audit):"),
    h("pre", { class: "args", tabindex: "0" }, compactJson(a.args_preview)),
    self
      ? h(
          "p",
          { class: "status info self" },
          `${a.principal} requested this: another operator must decide it (self-approval is refused).`,
        )
      : null,
    h(
      "div",
      { class: "actions" },
      h("label", { for: `reason-${a.id}`, class: "sr-only" }, "Reason"),
      reason,
      h(
        "button",
        { type: "button", class: "approve", disabled: self, onclick: () => decide("approve") },
        "Approve",
      ),
      h(
        "button",
        { type: "button", class: "deny", disabled: self, onclick: () => decide("deny") },
        "Deny",
      ),
    ),
    msg,
  );
}

async function approvalsPage(root: HTMLElement) {
  const pending = h("section", { id: "pending", "aria-live": "polite" });
  const history = h("section", { id: "history" });
  const pager = h("nav", { id: "approvals-pager", "aria-label": "approval pages" });
  root.replaceChildren(
    h("h1", {}, "Approvals"),
    h("p", { class: "hint" }, "New requests appear here as agents make them."),
    pending,
    h("h2", {}, "History"),
    history,
    pager,
  );
  // Pages of PAGE_SIZE: every pending approval comes first, however many newer ones there are.
  const PAGE_SIZE = 100;
  let offset = 0;
  let busy = false;
  const refresh = async () => {
    if (busy) return;
    busy = true;
    try {
      const data = await api(`approvals?offset=${offset}&limit=${PAGE_SIZE}`);
      const total = data.pending_total + data.history_total;
      if (offset > 0 && offset >= total) {
        offset = Math.max(0, total - PAGE_SIZE); // the last page emptied: show the one before
        busy = false;
        return void refresh();
      }
      const go = (to: number) => () => {
        offset = to;
        void refresh();
      };
      pager.replaceChildren(
        ...(total > PAGE_SIZE
          ? [
              h(
                "button",
                {
                  type: "button",
                  disabled: offset === 0,
                  onclick: go(Math.max(0, offset - PAGE_SIZE)),
                },
                "Previous",
              ),
              h(
                "span",
                { class: "hint" },
                ` ${offset + 1}–${Math.min(offset + PAGE_SIZE, total)} of ${total} `,
              ),
              h(
                "button",
                {
                  type: "button",
                  disabled: offset + PAGE_SIZE >= total,
                  onclick: go(offset + PAGE_SIZE),
                },
                "Next",
              ),
            ]
          : []),
      );
      pending.replaceChildren(
        h(
          "h2",
          {},
          data.pending_total > data.pending.length
            ? `Pending (${data.pending_total}; ${data.pending.length} on this page)`
            : `Pending (${data.pending_total})`,
        ),
        ...(data.pending.length
          ? data.pending.map((a: Json) => approvalCard(a, refresh))
          : [
              status(
                data.pending_total
                  ? "The pending ones are on the previous pages."
                  : "Nothing is waiting for a decision.",
              ),
            ]),
      );
      history.replaceChildren(
        data.history.length === 0
          ? status(data.history_total ? "More history on the next pages." : "No decisions yet.")
          : table(
              [
                "outcome",
                "principal",
                "tool",
                "decided by",
                "reason",
                "requested",
                "decided / used",
              ],
              data.history.map((a: Json) => [
                h("span", { class: `badge ${a.status}` }, a.status),
                a.principal,
                h("code", {}, a.tool),
                a.decided_by ?? "–",
                a.reason ?? "",
                when(a.created_at),
                when(a.used_at ?? a.decided_at),
              ]),
              "approval history",
            ),
      );
    } catch (x) {
      pending.replaceChildren(status((x as Error).message, "bad"));
    } finally {
      busy = false;
    }
  };
  await refresh();
  on("approval", () => void refresh());
  every(1000, () => {
    for (const el of root.querySelectorAll<HTMLElement>(".countdown"))
      el.textContent = countdown(el.dataset.expires!);
  });
}

async function activityPage(root: HTMLElement) {
  const outcomes = [
    "",
    "allowed",
    "executed",
    "failed",
    "denied",
    "approval_requested",
    "approval_granted",
    "approval_denied",
    "approval_expired",
  ];
  const p = h("input", { id: "f-principal", type: "text", placeholder: "any" });
  const t = h("input", { id: "f-tool", type: "text", placeholder: "any" });
  const o = h(
    "select",
    { id: "f-outcome" },
    ...outcomes.map((x) => h("option", { value: x }, x || "any")),
  );
  const result = h("div", { id: "audit" });
  const form = h(
    "form",
    { class: "filters" },
    h("label", { for: "f-principal" }, "Principal"),
    p,
    h("label", { for: "f-tool" }, "Tool"),
    t,
    h("label", { for: "f-outcome" }, "Outcome"),
    o,
    h("button", { type: "submit" }, "Filter"),
  );
  const load = async () => {
    const q = new URLSearchParams();
    if (p.value) q.set("principal", p.value);
    if (t.value) q.set("tool", t.value);
    if (o.value) q.set("outcome", o.value);
    try {
      const d = await api(`audit?${q}`);
      const v = d.verify;
      // Verified in the background from a checkpoint on: say how far, and whether it goes on.
      const upTo = v.verified_at ? ` (up to #${v.verified_seq}, ${when(v.verified_at)})` : "";
      const going = v.in_progress
        ? ` Verifying records after #${v.checked} of ${v.head_seq}…`
        : v.head_seq > v.verified_seq
          ? ` ${v.head_seq - v.verified_seq} newer record(s) not yet verified.`
          : "";
      result.replaceChildren(
        status(
          v.ok
            ? `Chain intact: ${v.checked} record(s) verified${upTo}.${going}`
            : `TAMPERED at record #${v.first_bad_seq}: ${v.reason}`,
          v.ok ? "ok" : "bad",
        ),
        table(
          ["#", "time", "principal", "tool", "outcome", "code", "ms", "approval", "reason"],
          d.records.map((r: Json) => [
            String(r.seq),
            when(r.time),
            r.principal,
            h("code", {}, r.tool),
            h("span", { class: `badge ${r.outcome}` }, r.outcome),
            // An aggregate of repeated refusals says how many it stands for.
            r.count != null ? `${r.code ?? ""} ×${r.count}` : (r.code ?? ""),
            r.duration_ms != null ? String(r.duration_ms) : "",
            r.approval_id ? h("code", {}, r.approval_id.slice(0, 12) + "…") : "",
            r.reason ?? "",
          ]),
          "audit records",
        ),
      );
    } catch (x) {
      result.replaceChildren(status((x as Error).message, "bad"));
    }
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void load();
  });
  root.replaceChildren(h("h1", {}, "Activity"), form, result);
  await load();
}

async function jobsPage(root: HTMLElement) {
  const list = h("div", { id: "jobs" });
  root.replaceChildren(h("h1", {}, "Jobs"), list);
  const load = async () => {
    try {
      const d = await api("jobs");
      list.replaceChildren(
        d.jobs.length
          ? table(
              ["job", "tool", "principal", "status", "progress", "message", "updated", ""],
              d.jobs.map((j: Json) => [
                h("code", {}, j.job_id),
                j.tool,
                j.principal,
                h("span", { class: `badge ${j.status}` }, j.status),
                j.total
                  ? h("progress", { max: String(j.total), value: String(j.progress ?? 0) })
                  : j.progress != null
                    ? String(j.progress)
                    : "",
                j.error ? `${j.error.code}: ${j.error.message}` : (j.message ?? ""),
                when(j.updated_at),
                me?.admin && j.status === "running"
                  ? h(
                      "button",
                      {
                        type: "button",
                        onclick: async () => {
                          await api(`jobs/${j.job_id}/cancel`, { method: "POST", body: {} });
                          void load();
                        },
                      },
                      "Cancel",
                    )
                  : "",
              ]),
              "jobs",
            )
          : status("No jobs yet (tools called with wait: false start one)."),
      );
    } catch (x) {
      list.replaceChildren(status((x as Error).message, "bad"));
    }
  };
  await load();
  every(3000, () => void load());
}

/** Renders any array of flat objects as a table (so pool fields show up without a release). */
function objectsTable(items: Json[], label: string): HTMLElement {
  const keys = [...new Set(items.flatMap((i) => Object.keys(i)))].filter(
    (k) => typeof items.find((i) => i[k] != null)?.[k] !== "object",
  );
  return table(
    keys,
    items.map((i) =>
      keys.map((k) =>
        /(^|_)bytes(_|$)/.test(k) && typeof i[k] === "number" ? bytes(i[k]) : String(i[k] ?? "–"),
      ),
    ),
    label,
  );
}

async function runtimePage(root: HTMLElement) {
  const body = h("div", { id: "runtime" });
  root.replaceChildren(h("h1", {}, "Runtime"), body);
  const load = async () => {
    try {
      const d = await api("runtime");
      const s = d.status;
      if (!s) {
        body.replaceChildren(status(`worker ${d.runtime_state}: ${d.error ?? "no status"}`, "bad"));
        return;
      }
      const w = s.worker;
      const workers: Json[] = Array.isArray(s.workers) ? s.workers : [w];
      const devices: Json[] = s.devices?.length ? s.devices : s.device ? [s.device] : [];
      body.replaceChildren(
        h(
          "dl",
          { class: "facts" },
          h("dt", {}, "Worker"),
          h(
            "dd",
            {},
            `${w.state}${w.pid ? `, pid ${w.pid}` : ""}, ${w.restarts} restart(s), ${w.in_flight} in flight`,
          ),
          h("dt", {}, "torch"),
          h(
            "dd",
            {},
            `${s.torch_version ?? "?"} (${s.execution_mode ?? "?"}, matmul ${s.matmul_precision ?? "?"})`,
          ),
          h("dt", {}, "Jobs running"),
          h("dd", {}, String(s.jobs_running)),
        ),
        h("h2", {}, `Workers (${workers.length})`),
        objectsTable(workers, "workers"),
        h("h2", {}, `Devices (${devices.length})`),
        devices.length ? objectsTable(devices, "devices") : status("no device reported"),
        h("h2", {}, `Loaded models (${s.loaded.length})`),
        s.loaded.length
          ? objectsTable(s.loaded, "loaded models")
          : status("No model is loaded (load_model loads one)."),
      );
    } catch (x) {
      body.replaceChildren(status((x as Error).message, "bad"));
      // A refusal will not change by asking again (and each ask is audited): stop polling.
      if (x instanceof ApiError && x.status === 403) {
        refused = true;
        stopPolling?.();
      }
    }
  };
  let refused = false;
  let stopPolling: (() => void) | undefined;
  await load();
  if (!refused) stopPolling = every(5000, () => void load());
}

async function benchmarksPage(root: HTMLElement) {
  const d = await api("benchmarks");
  const reports: Json[] = d.reports;
  if (!reports.length) {
    root.replaceChildren(
      h("h1", {}, "Benchmarks"),
      status("No reports yet: run_benchmark stores one per run."),
    );
    return;
  }
  const label = (r: Json) =>
    `${r.id} · ${r.model} on ${r.device} · ${r.scenario ?? ""} · ${when(r.created_at)}`;
  const a = h(
    "select",
    { id: "report-a" },
    ...reports.map((r) => h("option", { value: r.id }, label(r))),
  );
  const b = h(
    "select",
    { id: "report-b" },
    h("option", { value: "" }, "(none)"),
    ...reports.map((r) => h("option", { value: r.id }, label(r))),
  );
  const charts = h("div", { id: "charts", class: "charts" });
  const details = h("div", { id: "report-table" });
  let undraw: (() => void) | null = null;
  cleanup.push(() => undraw?.());
  const draw = async () => {
    const ids = [a.value, b.value].filter((x, i, all) => x && all.indexOf(x) === i);
    const got = await Promise.all(ids.map((id) => api(`benchmarks/${id}`)));
    const inputs = got.map((r, i) => ({
      label: i === 0 ? `A ${r.id.slice(6, 12)}` : `B ${r.id.slice(6, 12)}`,
      report: r.report as Report,
    }));
    undraw?.();
    undraw = drawReports(charts, inputs);
    details.replaceChildren(
      h(
        "div",
        { class: "scroll", tabindex: "0", role: "region", "aria-label": "report numbers" },
        reportTable(inputs),
      ),
    );
  };
  a.addEventListener("change", () => void draw());
  b.addEventListener("change", () => void draw());
  root.replaceChildren(
    h("h1", {}, "Benchmarks"),
    h(
      "div",
      { class: "filters" },
      h("label", { for: "report-a" }, "Report"),
      a,
      h("label", { for: "report-b" }, "Compare with"),
      b,
    ),
    h(
      "p",
      { class: "hint" },
      "Hover a chart for values; p50 solid, p90 dashed, p99 dotted; the compared report is drawn thinner.",
    ),
    charts,
    h("h2", {}, "Numbers"),
    details,
  );
  await draw();
}

const PAGES: Record<string, (root: HTMLElement) => Promise<void>> = {
  approvals: approvalsPage,
  activity: activityPage,
  jobs: jobsPage,
  runtime: runtimePage,
  benchmarks: benchmarksPage,
};

async function route() {
  if (!me) return;
  stopPage();
  const name = location.hash.replace(/^#\/?/, "") || "approvals";
  const page = PAGES[name] ?? approvalsPage;
  for (const a of document.querySelectorAll<HTMLAnchorElement>("#nav a")) {
    if (a.getAttribute("href") === `#/${name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const root = h("div", { class: "page", "data-page": name });
  main().replaceChildren(root);
  try {
    await page(root);
  } catch (x) {
    if (!(x instanceof ApiError && x.status === 401))
      root.append(status((x as Error).message, "bad"));
  }
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · tpu-mcp console`;
}

window.addEventListener("hashchange", () => void route());
window.addEventListener("DOMContentLoaded", async () => {
  try {
    const s = await api("session");
    if (s.signed_in) start(s);
    else showSignIn();
  } catch {
    showSignIn();
  }
});

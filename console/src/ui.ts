// The console's DOM helpers and a page's lifetime (timers and listeners stopped when the page
// changes). No framework: small functions over the DOM.

export type Json = Record<string, any>;
export type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
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

let cleanup: (() => void)[] = [];
export const main = () => document.getElementById("main")!;

/** Local time as YYYY-MM-DD HH:MM:SS (unambiguous in every locale). */
export function when(iso: string | null | undefined): string {
  if (!iso) return "–";
  const d = new Date(iso);
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function countdown(iso: string): string {
  const s = Math.round((Date.parse(iso) - Date.now()) / 1000);
  if (s <= 0) return "expired";
  const m = Math.floor(s / 60);
  return m >= 60 ? `${Math.floor(m / 60)} h ${m % 60} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}

export function bytes(n: number | null | undefined): string {
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

export function estimateText(e: Json | null): string {
  if (!e) return "no estimate";
  return [
    `${e.device_seconds} device-s`,
    // Present only with the server's `pricing` set.
    e.cost ? `~${e.cost.amount} ${e.cost.currency}` : "",
    `${bytes(e.memory_bytes)} memory`,
    e.weight_bytes ? `${bytes(e.weight_bytes)} weights` : "",
    e.compile_s ? `${e.compile_s} s compile` : "no compile",
  ]
    .filter(Boolean)
    .join(" · ");
}

export function status(text: string, kind: "ok" | "bad" | "info" = "info") {
  return h("p", { class: `status ${kind}`, role: kind === "bad" ? "alert" : "status" }, text);
}

export function table(headers: string[], rows: Child[][], label: string): HTMLElement {
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

export function stopPage() {
  for (const f of cleanup) f();
  cleanup = [];
}

export function every(ms: number, fn: () => void): () => void {
  const t = setInterval(fn, ms);
  const stop = () => clearInterval(t);
  cleanup.push(stop);
  return stop;
}

export function on(type: string, fn: (e: Event) => void) {
  window.addEventListener(type, fn);
  cleanup.push(() => window.removeEventListener(type, fn));
}

/** Runs `fn` when the page is left (charts to tear down, streams to close). */
export function onLeave(fn: () => void): void {
  cleanup.push(fn);
}

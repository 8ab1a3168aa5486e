// The Activity page: the audit trail, filtered, with the chain's verification state.
import { api } from "../session.js";
import { h, when, status, table, type Json } from "../ui.js";

export async function activityPage(root: HTMLElement) {
  const outcomes = [
    "",
    "allowed",
    "executed",
    "failed",
    "interrupted",
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

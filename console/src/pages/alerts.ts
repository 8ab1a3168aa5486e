// The Alerts page: what the alert rules saw (policy.alerts), newest first, and the principals
// suspended now with how each suspension ends (`tpu-mcp principals resume ID` lifts one).
import { api } from "../session.js";
import { h, when, status, table, every, type Json } from "../ui.js";

export async function alertsPage(root: HTMLElement) {
  const suspended = h("div", { id: "suspended" });
  const list = h("div", { id: "alerts" });
  root.replaceChildren(
    h("h1", {}, "Alerts"),
    h("h2", {}, "Suspended principals"),
    suspended,
    h("h2", {}, "Alerts"),
    list,
  );
  const load = async () => {
    try {
      const d = await api("alerts");
      suspended.replaceChildren(
        d.suspended.length
          ? table(
              ["principal", "rule", "since", "ends", "reason", "lift with"],
              d.suspended.map((s: Json) => [
                s.principal,
                s.rule,
                when(s.since),
                s.until ? when(s.until) : "when resumed",
                s.reason,
                h("code", {}, `tpu-mcp principals resume ${s.principal}`),
              ]),
              "suspended",
            )
          : status("No principal is suspended."),
      );
      list.replaceChildren(
        d.alerts.length
          ? table(
              ["fired", "rule", "subject", "action", "message"],
              d.alerts.map((a: Json) => [
                when(a.fired_at),
                a.rule,
                a.subject,
                h(
                  "span",
                  { class: `badge ${a.action === "suspend" ? "denied" : "pending"}` },
                  a.action,
                ),
                a.message,
              ]),
              "alerts",
            )
          : status("No alert has fired."),
      );
    } catch (x) {
      list.replaceChildren(status((x as Error).message, "bad"));
    }
  };
  await load();
  every(5000, () => void load());
}

// The Jobs page: every principal's jobs; admins can cancel a running one.
import { api, currentSession } from "../session.js";
import { h, when, status, table, every, type Json } from "../ui.js";

export async function jobsPage(root: HTMLElement) {
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
                currentSession()?.admin && j.status === "running"
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

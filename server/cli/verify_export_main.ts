// The receiver's verifier on its own: `node dist/verify-export.mjs FILE --head HASH` (bundled by
// scripts/build.mjs with nothing but Node built-ins; no tpu-mcp install, data dir or key).
import { runVerifyExport } from "./verify_export.js";

const args = process.argv.slice(2);
const at = args.indexOf("--head");
const head = at >= 0 ? args[at + 1] : undefined;
const file = args.find((a, i) => !a.startsWith("--") && (at < 0 || i !== at + 1));
const print = (s: string) => process.stdout.write(s + "\n");
process.exitCode = runVerifyExport(file, head, {
  out: print,
  err: (s) => process.stderr.write(s + "\n"),
  json: args.includes("--json"),
});

// `tpu-mcp audit verify-export FILE --head HASH`: a receiver's check of an export, with no data
// dir, config or key (policies/audit_export_proof.ts does the checking). Also bundled on its own
// as dist/verify-export.mjs (verify_export_main.ts) for a receiver without tpu-mcp.
import { closeSync, existsSync, openSync, readFileSync, readSync } from "node:fs";
import { verifyExport, type ExportVerifyResult } from "../../policies/audit_export_proof.js";

/** The lines of a file, read in chunks (an export of millions of records is not held whole). */
function* fileLines(path: string): Generator<string> {
  const fd = openSync(path, "r");
  try {
    const buf = Buffer.alloc(1 << 20);
    let rest = "";
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      const parts = (rest + buf.toString("utf8", 0, n)).split("\n");
      rest = parts.pop() ?? "";
      yield* parts;
    }
    if (rest !== "") yield rest;
  } finally {
    closeSync(fd);
  }
}

/** `--head`: the export hash itself, or a file holding `tpu-mcp audit head`'s line. */
export function readHeadArg(head: string): string {
  if (/^[0-9a-fA-F]{64}$/.test(head.trim())) return head.trim();
  if (!existsSync(head))
    throw new Error(
      `--head ${head}: give the export_hash (64 hex digits) from \`tpu-mcp audit head\`, or a file holding its output`,
    );
  const line = readFileSync(head, "utf8").trim().split("\n").pop() ?? "";
  let h: { export_hash?: unknown };
  try {
    h = JSON.parse(line) as { export_hash?: unknown };
  } catch {
    throw new Error(`--head ${head}: not the output of \`tpu-mcp audit head\` (not JSON)`);
  }
  if (typeof h.export_hash !== "string")
    throw new Error(`--head ${head}: no export_hash in it (made by an older \`audit head\`?)`);
  return h.export_hash;
}

export function runVerifyExport(
  file: string | undefined,
  head: string | undefined,
  io: { out: (s: string) => void; err: (s: string) => void; json: boolean },
): number {
  if (!file || !head) {
    io.err("usage: tpu-mcp audit verify-export FILE --head HASH|HEADFILE");
    return 2;
  }
  let want: string;
  let v: ExportVerifyResult;
  try {
    want = readHeadArg(head);
    v = verifyExport(fileLines(file), want);
  } catch (e) {
    io.err((e as Error).message);
    return 2;
  }
  if (io.json) io.out(JSON.stringify(v));
  else io.out(v.ok ? `ok: ${v.reason}` : `BROKEN at record #${v.first_bad_seq}: ${v.reason}`);
  return v.ok ? 0 : 1;
}

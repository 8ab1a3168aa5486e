// scripts/side_by_side.mjs, which `npm test` (vitest beside pytest) and .ci/run (two lanes of
// suites) run their suites with: the real script and real child processes. Its parts run at once
// (each waits to see the other's mark, so run one after another the first never sees it), a part
// that fails fails the whole, and a second part's output comes after the first's, whole.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const SCRIPT = join(ROOT, "scripts", "side_by_side.mjs");

/**
 * Runs the script to its end: exit code and output, never a throw. Its environment is this
 * process's without TPU_MCP_SIDE_BY_SIDE, which .ci/run sets to 0 around `npm test` (lane A): a
 * case sets it itself.
 */
async function sideBySide(args: string[], env: Record<string, string> = {}) {
  const { TPU_MCP_SIDE_BY_SIDE: _inherited, ...base } = process.env;
  try {
    const r = await run(process.execPath, [SCRIPT, ...args], {
      env: { ...base, ...env },
      timeout: scaled(60_000),
    });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e: any) {
    return {
      code: e.code as number,
      stdout: String(e.stdout ?? ""),
      stderr: String(e.stderr ?? ""),
    };
  }
}

/** A part that leaves its mark, then waits for the other's: exit 0 once seen, 3 if never. */
function waiter(dir: string, mine: string, theirs: string): string {
  const file = join(dir, `${mine}.mjs`);
  writeFileSync(
    file,
    `import { existsSync, writeFileSync } from "node:fs";
writeFileSync(${JSON.stringify(join(dir, mine))}, "");
const until = Date.now() + ${scaled(20_000)};
while (!existsSync(${JSON.stringify(join(dir, theirs))})) {
  if (Date.now() > until) { console.log("${mine} never saw ${theirs}"); process.exit(3); }
  await new Promise((r) => setTimeout(r, 20));
}
console.log("${mine} saw ${theirs}");
`,
  );
  return `"${process.execPath}" "${file}"`;
}

describe("side_by_side.mjs", () => {
  it("runs its parts at the same time and passes when each passes", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-sbs-"));
    const r = await sideBySide(["first", waiter(dir, "a", "b"), "second", waiter(dir, "b", "a")]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain("a saw b");
    expect(r.stdout).toContain("b saw a");
    expect(r.stderr).toMatch(/first: passed in \d+ s/);
    expect(r.stderr).toMatch(/second: passed in \d+ s/);
  });

  it("fails when one part fails, naming it, and prints the second part's output after the first's", async () => {
    const r = await sideBySide([
      "vitest",
      "echo first-part-output",
      "pytest",
      "echo second-part-output; exit 4",
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/pytest: FAILED \(exit 4\)/);
    expect(r.stderr).toMatch(/vitest: passed/);
    const first = r.stdout.indexOf("first-part-output");
    const header = r.stdout.indexOf("---- pytest");
    expect(first).toBeGreaterThanOrEqual(0);
    expect(header).toBeGreaterThan(first);
    expect(r.stdout.indexOf("second-part-output")).toBeGreaterThan(header);
  });

  it("runs them one after another with TPU_MCP_SIDE_BY_SIDE=0", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-sbs-"));
    const r = await sideBySide(
      ["first", `touch "${join(dir, "one")}"`, "second", `test -e "${join(dir, "one")}"`],
      { TPU_MCP_SIDE_BY_SIDE: "0" },
    );
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stderr).toContain("one after another");
    expect(existsSync(join(dir, "one"))).toBe(true);
  });

  it("refuses arguments that are not NAME COMMAND pairs, with an example", async () => {
    const r = await sideBySide(["vitest"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/takes NAME COMMAND pairs \(got 1 argument\(s\)\); e\.g\./);
  });
});

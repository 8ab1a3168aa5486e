// `tpu-mcp doctor` on a catalog with several problems: the real CLI prints them as lines of their
// own under the failed check, not one line with escaped newlines (`\u000a`) in it.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { cli, writeConfig } from "../helpers/server.js";

describe("doctor's output", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-doctor-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("keeps the line breaks of a multi-line problem, each line indented under its check", async () => {
    const catalog = join(dir, "broken-catalog.json");
    writeFileSync(catalog, JSON.stringify({ models: [{ id: "one" }, { id: "two" }] }));
    // No Python: the doctor reports the config and the catalog and stops before a worker.
    const config = writeConfig(
      { runtime: { catalog, python: join(dir, "no-python"), device: "cpu" } },
      dir,
    );
    const r = await cli(config, "doctor");
    expect(r.code).toBe(1);
    expect(r.stdout).not.toContain("\\u000a");
    const lines = r.stdout.split("\n");
    const first = lines.findIndex((l) => l.startsWith("  FAIL invalid catalog"));
    expect(first, r.stdout).toBeGreaterThan(-1);
    expect(lines[first]).toMatch(/^ {2}FAIL invalid catalog .*broken-catalog\.json:$/);
    // Every problem on a line of its own, indented past the check's tag.
    const rest = lines.slice(first + 1).filter((l) => l.startsWith("         - "));
    expect(rest.length).toBeGreaterThanOrEqual(4);
    expect(rest).toContainEqual(expect.stringMatching(/- model_roots: /));
    expect(rest).toContainEqual(expect.stringMatching(/- models\.1\.task: /));
  });
});

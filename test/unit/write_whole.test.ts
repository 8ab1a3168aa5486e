// The build writes dist/ whole (scripts/lib/write_whole.mjs): CI's package suite rebuilds dist/
// (`npm pack`'s prepack) while suites beside it start servers from dist/cli.mjs and serve
// dist/console. A second process reads the file in a loop while this one rewrites it, and must
// only ever read a whole old or a whole new version, never a truncated or mixed one.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
// @ts-expect-error: a plain .mjs build helper without types
import { writeWhole } from "../../scripts/lib/write_whole.mjs";
import { scaled } from "../helpers/calibrate.js";
import { waitFor } from "../helpers/wait.js";

const SIZE = 4 << 20;

const READER = `
import { readFileSync } from "node:fs";
const [file, size] = [process.argv[1], Number(process.argv[2])];
let reads = 0, torn = 0;
process.stdin.on("data", () => { console.log(JSON.stringify({ reads, torn })); process.exit(0); });
const loop = () => {
  for (let i = 0; i < 20; i++) {
    const b = readFileSync(file);
    reads++;
    if (b.length !== size || b[0] !== b[b.length - 1]) torn++;
  }
  if (reads === 20) console.error("reading");
  setImmediate(loop);
};
loop();
`;

describe("writeWhole", () => {
  it("never lets another process read a partly written file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-whole-"));
    const file = join(dir, "cli.mjs");
    writeFileSync(file, Buffer.alloc(SIZE, 65));
    const reader = spawn(
      process.execPath,
      ["--input-type=module", "-e", READER, file, String(SIZE)],
      {
        stdio: ["pipe", "pipe", "pipe"],
      },
    );
    let out = "";
    let err = "";
    reader.stdout.on("data", (d) => (out += d));
    reader.stderr.on("data", (d) => (err += d));
    await waitFor(
      "the reader",
      () => (err.includes("reading") ? true : undefined),
      scaled(20_000),
      20,
    );
    for (let i = 0; i < 60; i++) writeWhole(file, Buffer.alloc(SIZE, i % 2 ? 66 : 65));
    const ended = new Promise((r) => reader.once("exit", r));
    reader.stdin.write("stop\n");
    await ended;
    const { reads, torn } = JSON.parse(out);
    expect(reads).toBeGreaterThan(20);
    expect(torn).toBe(0);
  });
});

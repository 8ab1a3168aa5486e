import { readdirSync, readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

const dir = new URL("../../policies/", import.meta.url);
const files = readdirSync(dir).filter((f) => f.endsWith(".ts"));

describe("policies/ boundaries", () => {
  it.each(files)("%s imports nothing from runtime/, tools/ or server/", (f) => {
    const src = readFileSync(new URL(f, dir), "utf8");
    const imports = [...src.matchAll(/from\s+["']([^"']+)["']/g)].map((m) => m[1]!);
    for (const spec of imports) expect(spec).not.toMatch(/(^|\/)(runtime|tools|server)(\/|$)/);
  });

  it.each(files)("%s reads no environment, never exits and never writes to the console", (f) => {
    const src = readFileSync(new URL(f, dir), "utf8");
    expect(src).not.toMatch(/process\.(env|exit|argv)|console\./);
  });
});

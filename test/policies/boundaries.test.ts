import { readdirSync, readFileSync } from "node:fs";
import { dirname, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { importSites } from "../helpers/imports.js";

const root = fileURLToPath(new URL("../../policies/", import.meta.url));
// Every .ts file under policies/, sub-folders included, as a path relative to policies/.
const files = (readdirSync(root, { recursive: true }) as string[])
  .filter((f) => f.endsWith(".ts"))
  .map((f) => f.split(sep).join("/"))
  .sort();

/** Every import's specifier (test/helpers/imports.ts: any form, any quote; null when computed). */
function importsOf(f: string): (string | null)[] {
  return importSites(readFileSync(resolve(root, f), "utf8")).map((s) => s.spec);
}

describe("policies/ boundaries", () => {
  it("finds the files of the sub-folders too", () => {
    expect(files).toEqual(
      expect.arrayContaining(["gate/gate.ts", "gate/steps.ts", "limits/budget.ts"]),
    );
  });

  it.each(files)("%s imports nothing from outside policies/ but packages and lib/", (f) => {
    for (const spec of importsOf(f)) {
      expect(spec, `${f} has a computed import, which cannot be checked`).not.toBeNull();
      if (spec === null) continue;
      if (!spec.startsWith(".")) {
        // A package (or node:): never a path into another room spelled without dots. A scoped
        // package's own name (@simplewebauthn/server) is not a path: only what follows it is.
        const path = spec.startsWith("@") ? spec.split("/").slice(2).join("/") : spec;
        expect(path).not.toMatch(/^\/|(^|\/)(runtime|tools|server)(\/|$)/);
        continue;
      }
      const target = relative(root, resolve(dirname(resolve(root, f)), spec));
      // lib/ is the dependency-free leaf (device strings, dtypes, units) every room may use.
      if (target.startsWith("../lib/")) continue;
      expect(target.startsWith(".."), `${f} imports ${spec}`).toBe(false);
    }
  });

  it.each(files)("%s reads no environment, never exits and never writes to the console", (f) => {
    const src = readFileSync(resolve(root, f), "utf8");
    // `console.` followed by a name: a call, not prose ending a sentence with "the console."
    expect(src).not.toMatch(/process\.(env|exit|argv)|console\.[a-z]/);
  });
});

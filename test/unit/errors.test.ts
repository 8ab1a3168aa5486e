// One catalogue of error codes: every code any layer can produce is in tools/errors.ts, and the
// docs/errors.md's table documents exactly that catalogue.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { POLICY_ERROR_CODES } from "../../policies/errors.js";
import { RUNTIME_ERROR_CODES } from "../../runtime/types.js";
import { ERROR_CATALOGUE, ToolError, scrubMessage, toToolError } from "../../tools/errors.js";
import { ROOT } from "../helpers/server.js";

const catalogue = new Set(Object.keys(ERROR_CATALOGUE));

describe("error catalogue", () => {
  it("matches the Errors table of docs/errors.md exactly", () => {
    const page = readFileSync(join(ROOT, "docs/errors.md"), "utf8");
    const documented = new Set([...page.matchAll(/^\| `([a-z_]+)` *\|/gm)].map((m) => m[1]));
    expect([...documented].sort()).toEqual([...catalogue].sort());
  });

  it("covers every policy, runtime and worker code", () => {
    const policy = Object.keys(POLICY_ERROR_CODES).map((c) =>
      c === "invalid_arguments" ? "invalid_argument" : c,
    );
    const worker = [
      ...readFileSync(join(ROOT, "runtime/worker/tpu_worker/errors.py"), "utf8").matchAll(
        /^\s+"([a-z_]+)",$/gm,
      ),
    ].map((m) => m[1]);
    expect(worker.length).toBeGreaterThan(10);
    for (const code of [...policy, ...RUNTIME_ERROR_CODES, ...worker])
      expect(catalogue, code).toContain(code);
  });

  it("maps unknown failures to internal without leaking their message", () => {
    const e = toToolError(
      new Error("ENOENT: /home/alice/secret/model.bin at Object.<anonymous> (x.ts:1:1)"),
    );
    expect(e.code).toBe("internal");
    expect(e.message).not.toMatch(/alice|secret/);
  });

  it("scrubs paths from known errors' messages", () => {
    const e = toToolError({
      code: "weights_missing",
      message: "no file /srv/models/x/model.safetensors\n  at load",
    });
    expect(e).toBeInstanceOf(ToolError);
    expect(e.message).toBe("no file <path>");
    expect(scrubMessage("a /b/c d")).toBe("a <path> d");
  });
});

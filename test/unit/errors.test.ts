// One catalogue of error codes (policies/errors.ts): every code any layer can produce is in it,
// docs/errors.md's table documents exactly that catalogue, and the worker agrees on `recoverable`.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ERROR_CATALOGUE, POLICY_ERROR_CODES } from "../../policies/errors.js";
import { RUNTIME_ERROR_CODES } from "../../runtime/types.js";
import { ToolError, scrubMessage, toToolError } from "../../tools/errors.js";
import { ROOT } from "../helpers/server.js";

const catalogue = new Set(Object.keys(ERROR_CATALOGUE));

/** The worker's own table, as the worker itself reads it (code → recoverable). */
function workerRecoverable(): Record<string, boolean> {
  const out = execFileSync(
    join(ROOT, ".venv/bin/python"),
    [
      "-c",
      "import json; from tpu_worker.errors import RECOVERABLE; print(json.dumps(RECOVERABLE))",
    ],
    { cwd: join(ROOT, "runtime/worker"), encoding: "utf8" },
  );
  return JSON.parse(out) as Record<string, boolean>;
}

describe("error catalogue", () => {
  it("matches the Errors table of docs/errors.md exactly, recoverable column included", () => {
    const section = readFileSync(join(ROOT, "docs/errors.md"), "utf8");
    const rows = [...section.matchAll(/^\| `([a-z_]+)` *\| *(yes|no) *\|/gm)];
    const documented = Object.fromEntries(rows.map((m) => [m[1]!, m[2] === "yes"]));
    const expected = Object.fromEntries(
      Object.entries(ERROR_CATALOGUE).map(([code, e]) => [code, e.recoverable]),
    );
    expect(documented).toEqual(expected);
  });

  it("covers every policy, runtime and worker code", () => {
    const worker = Object.keys(workerRecoverable());
    expect(worker.length).toBeGreaterThan(10);
    for (const code of [...POLICY_ERROR_CODES, ...RUNTIME_ERROR_CODES, ...worker])
      expect(catalogue, code).toContain(code);
  });

  it("agrees with the worker on which codes are recoverable", () => {
    for (const [code, recoverable] of Object.entries(workerRecoverable()))
      expect(ERROR_CATALOGUE[code as keyof typeof ERROR_CATALOGUE].recoverable, code).toBe(
        recoverable,
      );
  });

  it("gives every code a one-line doc and an HTTP error status", () => {
    for (const [code, e] of Object.entries(ERROR_CATALOGUE)) {
      expect(e.doc.length, code).toBeGreaterThan(10);
      expect(e.doc, code).not.toContain("\n");
      expect(e.http, code).toBeGreaterThanOrEqual(400);
      expect(e.http, code).toBeLessThan(600);
    }
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

  it("leaves the parts the server composed to be used as written, and scrubs the rest", () => {
    const command = "node bin/tpu-mcp.js approvals approve apr_1 --config '/srv/my cfg/c.json'";
    const link = "https://h.example/tpu/console/#/approvals/apr_1";
    const e = toToolError({
      code: "approval_required",
      message: `from /home/alice/x.ts: open ${link} or run \`${command}\`\n  at f (/a/b.ts:1)`,
      verbatim: [command, link, "/not/in/the/message"],
    });
    expect(e.message).toBe(`from <path>: open ${link} or run \`${command}\``);
    // Without them, the same message loses both.
    expect(scrubMessage(`open ${link}`)).toBe("open https:/<path>#<path>");
  });

  it("keeps a policy refusal's code and its catalogue recoverability", () => {
    const e = toToolError({ code: "approval_required", message: "ask", details: { id: "a1" } });
    expect(e.code).toBe("approval_required");
    expect(e.recoverable).toBe(true);
    expect(e.details).toEqual({ id: "a1" });
  });
});

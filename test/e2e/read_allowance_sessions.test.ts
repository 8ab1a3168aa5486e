// A desktop user's day over stdio: every session starts a fresh server and worker, whose first
// check of a model (imports, first forward, allocator) costs many times a warm one (8–16 s against
// well under 1 s for mnist-cnn on a busy host). Charged to the read allowance, two sessions' cold
// starts spent it and check_model was refused for most of an hour. The cold start is charged to
// the principal's budget, not to the allowance. A real `tpu-mcp stdio` child per session, the
// SDK's real Client, a real worker.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

describe("check_model across desktop (stdio) sessions", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-read-sessions-"));
  // An allowance smaller than any check's estimate (its fixed overhead alone is 0.2 s): a check
  // charged to it is refused at once, so only one that is not charged to it runs.
  const config = writeConfig(
    {
      policy: {
        approvals: { rules: [] },
        limits: {
          rate_limit: { per_principal_per_minute: 6000 },
          budget: { read_device_seconds_per_window: 0.05 },
        },
      },
    },
    dir,
  );
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it(
    "runs each session's first check of a model (its cold start) without spending the read allowance; warm checks still draw on it",
    { timeout: scaled(300_000) },
    async () => {
      for (let session = 1; session <= 3; session++) {
        const s = await connectStdio(config);
        try {
          const cold = await call(s.client, "check_model", { model: "mnist-cnn" });
          expect(cold.isError, `session ${session}: ${JSON.stringify(cold)}`).toBeFalsy();
          expect(cold.structuredContent.verdict).toBe("supported");
          // The same check again is warm: a reader's call like any other, refused by the allowance.
          const warm = errorOf(await call(s.client, "check_model", { model: "mnist-cnn" }));
          expect(warm?.code, `session ${session}`).toBe("budget_exceeded");
          expect(warm?.message).toMatch(/allowance for read-scoped tools/);
        } finally {
          await s.close();
        }
      }
    },
  );
});

// A server's close writes the open refusal windows' aggregates before anything else closes:
// stopping the workers can take seconds, and an MCP host ends a stdio server by closing its input
// and then killing it (the SDK after 4 s), so aggregates written last were lost on a loaded host.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import type { AuditRecord } from "../../policies/audit.js";
import { createApp } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { ROOT } from "../helpers/server.js";

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-close-order-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const refusal = (i: number): AuditRecord => ({
  time: new Date().toISOString(),
  principal: "agent",
  tool: "run_inference",
  args_digest: i.toString(16).padStart(64, "0"),
  outcome: "denied",
  code: "rate_limited",
  reason: "rate_limited",
});

describe("closing the server", () => {
  it("writes the refusal aggregates before the first close hook runs", async () => {
    const app = await createApp(
      parseConfig({ data_dir: join(dir, "data"), runtime: { start: "lazy" } }, { root: ROOT }),
      pino({ level: "silent" }),
    );
    // The first refusal is recorded at once; the next four are counted into its window.
    for (let i = 0; i < 5; i++) await app.audit.appendRefusal(refusal(i));
    expect(app.audit.pendingRefusals()).toBe(4);
    // Registered last, so it runs first (close hooks run last-registered first).
    let seenAtFirstHook: number | undefined;
    app.onClose("probe", () => {
      seenAtFirstHook = app.audit.pendingRefusals();
    });
    await app.close();
    expect(seenAtFirstHook).toBe(0);
  });
});

// Issue 43, "from the anchors": an approval is bound to the version of the approval policy it was
// requested under. A config reload (SIGHUP) that changes the rules puts the new policy in effect
// at once, and an approval requested before it, approved before or after the reload, no longer
// counts: the call asks again, naming why. An unrelated reload changes nothing. Both eras, over
// HTTP: the 2025 SDK client and the 2026-07-28 one; a real server and worker, the operator CLI.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";

const LOAD = { model: "mnist-cnn" };

/** The config file in `dir`, with these approval rules (the rest as the demo's). */
function configWith(dir: string, rules: unknown[], logLevel = "warn"): string {
  return writeConfig(
    {
      log_level: logLevel,
      policy: {
        ...DEMO_POLICY,
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: { ...DEMO_POLICY.approvals, rules, elicitation: false },
      },
    },
    dir,
  );
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("an approval is bound to the approval policy it was requested under", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-policy-version-"));
  let config = "";
  let server: HttpServerProc;
  /** Each change of the rules is a new form that still asks the agent for load_model. */
  let version = 0;
  const rules = () => [{ tool: "load_model", principals: ["agent", `nobody-${version}`] }];

  beforeAll(async () => {
    config = configWith(dir, rules());
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Rewrites the file (rules changed unless `same`) and has the server reload it (SIGHUP). */
  async function reload(same = false): Promise<string> {
    if (!same) version++;
    configWith(dir, rules(), same ? "error" : "warn");
    const before = server.stderr().length;
    server.proc.kill("SIGHUP");
    const t0 = Date.now();
    while (!/config reload/.test(server.stderr().slice(before))) {
      if (Date.now() - t0 > scaled(30_000)) throw new Error("no reload in the server's log");
      await sleep(100);
    }
    return server.stderr().slice(before);
  }

  const approve = async (id: string) => {
    const ok = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
    expect(ok.code, ok.stderr).toBe(0);
  };

  const eras = [
    {
      era: "2025",
      connect: async () => {
        const c = await connectHttp(server.url, DEMO_TOKENS.agent);
        return { run: (n: string, a: Record<string, unknown>) => call(c.client, n, a), c };
      },
    },
    {
      era: "2026-07-28",
      connect: async () => {
        const c = await connectModernHttp(server.url, DEMO_TOKENS.agent);
        return { run: (n: string, a: Record<string, unknown>) => callModern(c.client, n, a), c };
      },
    },
  ];

  for (const { era, connect } of eras) {
    it(`${era}: a reload that changes the rules makes an approval given before it, or pending through it, ask again`, async () => {
      const { run, c } = await connect();
      try {
        for (const when of ["approved before the reload", "pending through the reload"]) {
          const asked = await run("load_model", LOAD);
          expect(errorOf(asked)?.code, JSON.stringify(asked)).toBe("approval_required");
          const first = errorOf(asked)!.details.approval_id as string;
          if (when === "approved before the reload") await approve(first);
          const log = await reload();
          expect(log).toMatch(/config reloaded: applied policy\.approvals\.rules/);
          if (when === "pending through the reload") await approve(first);

          const again = await run("load_model", { ...LOAD, approval_id: first });
          const e = errorOf(again);
          expect(e?.code, `${when}: ${JSON.stringify(again)}`).toBe("approval_required");
          expect(e!.details.approval_id).not.toBe(first);
          expect(e!.details.stale_approval_id).toBe(first);
          expect(e!.message).toContain(`Approval ${first} was requested under approval policy`);
          expect(e!.message).toMatch(/the policy has changed since/);

          // The new request is decided under the policy in effect, and counts.
          const second = e!.details.approval_id as string;
          await approve(second);
          const ran = await run("load_model", { ...LOAD, approval_id: second });
          expect(errorOf(ran), JSON.stringify(ran)).toBeUndefined();
          await run("unload_model", LOAD);
        }
        // A reload that leaves the approval policy as it is: an approval still counts.
        const asked = await run("load_model", LOAD);
        const id = errorOf(asked)!.details.approval_id as string;
        await approve(id);
        await reload(true);
        const ran = await run("load_model", { ...LOAD, approval_id: id });
        expect(errorOf(ran), JSON.stringify(ran)).toBeUndefined();
        await run("unload_model", LOAD);
      } finally {
        await c.close();
      }
    });
  }
});

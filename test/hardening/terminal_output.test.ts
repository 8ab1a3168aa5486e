// Issue 23, item 2: what a caller writes cannot forge the CLI's terminal output. An unknown
// argument name is echoed into the audit record's reason; `tpu-mcp audit tail` used to print it
// raw, so an agent could print a fake `approval_granted` line and ANSI codes that erase real
// lines. A real client against a real server, then the real CLI: one line per record and no raw
// control character, while the stored record keeps exactly what was sent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { auditRows, sha256 } from "./helpers.js";
import { dirname, join } from "node:path";
import { scaled } from "../helpers/calibrate.js";

// A principal id an operator may well configure (config refuses only C0/C1 in ids).
const MALLORY = "mallory\u202e\u2028";
const MALLORY_TOKEN = "terminal-test-mallory-token";
const FORGED =
  "x\n#999 2026-12-01T00:00:00.000Z operator load_model approval_granted — ok\u001b[2K\u001b[1A\r\u009b2K\u202e\u2028";
// Everything a terminal acts on: C0 but \n, DEL, C1, line/paragraph separators, bidi controls.
const RAW_CONTROL =
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/;

describe("terminal output cannot be forged through argument names", () => {
  let server: HttpServerProc;
  let config: string;

  beforeAll(async () => {
    config = writeConfig({
      runtime: { device: "cpu", start: "lazy" },
      policy: {
        ...DEMO_POLICY,
        tokens: [
          ...DEMO_POLICY.tokens,
          { id: MALLORY, token_sha256: sha256(MALLORY_TOKEN), scopes: ["models:read"] },
        ],
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: {
          ...DEMO_POLICY.approvals,
          rules: [{ tool: "list_models", principals: [MALLORY] }],
        },
      },
    });
    server = await startHttpServer(config);
    // A pending approval whose principal holds a bidi override and a line separator.
    const mallory = await connectHttp(server.url, MALLORY_TOKEN);
    const asked: any = await mallory.client.callTool({ name: "list_models", arguments: {} });
    expect(asked._meta?.["tpu-mcp/error"]?.code).toBe("approval_required");
    await mallory.close();
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    const r: any = await agent.client.callTool({
      name: "list_models",
      arguments: { [FORGED]: 1 },
    });
    expect(r.isError).toBe(true);
    await agent.close();
  }, scaled(120_000));

  afterAll(async () => {
    await server?.stop();
  });

  it(
    "`audit tail` prints one line per record and no raw control character",
    async () => {
      const dataDir = join(dirname(config), "data");
      const rows = auditRows(dataDir);
      // The record keeps what was sent (the escape is only on the way to a terminal).
      const forged = rows.find((r) => String(r.reason ?? "").includes("\u001b[2K"));
      expect(forged, JSON.stringify(rows.map((r) => r.reason))).toBeDefined();
      expect(forged!.reason).toContain("\n#999");

      const tail = await cli(config, "audit", "tail", "-n", "100");
      expect(tail.code, tail.stderr).toBe(0);
      const lines = tail.stdout.replace(/\n$/, "").split("\n");
      expect(lines).toHaveLength(rows.length);
      for (const [i, line] of lines.entries())
        expect(line).toMatch(new RegExp(`^#${rows[i].seq} `));
      expect(tail.stdout).not.toMatch(RAW_CONTROL);
      expect(tail.stderr).not.toMatch(RAW_CONTROL);
      // No line of the output is a record the server did not write.
      expect(lines.filter((l) => /approval_granted/.test(l.split(" — ")[0]))).toHaveLength(0);
      // The escapes are visible instead.
      expect(tail.stdout).toContain("\\u000a#999");
      expect(tail.stdout).toContain("\\u001b[2K");

      // --json stays valid JSON with the same values, and carries no raw control character either.
      const json = await cli(config, "audit", "tail", "-n", "100", "--json");
      expect(json.stdout).not.toMatch(RAW_CONTROL);
      const parsed = JSON.parse(json.stdout);
      expect(parsed.some((r: any) => r.reason === forged!.reason)).toBe(true);
    },
    scaled(60_000),
  );

  it(
    "`approvals list|show`, `audit verify|head` and `workers list` pass their text through the same escape",
    async () => {
      const list = await cli(config, "approvals", "list");
      expect(list.stdout).toContain("mallory\\u202e\\u2028");
      const id = /apr_[0-9a-f]{32}/.exec(list.stdout)![0];
      for (const args of [
        ["approvals", "list"],
        ["approvals", "list", "--json"],
        ["approvals", "show", id],
        ["audit", "verify"],
        ["audit", "head"],
        ["workers", "list"],
      ]) {
        const r = await cli(config, ...args);
        expect(r.stdout + r.stderr, args.join(" ")).not.toMatch(RAW_CONTROL);
      }
    },
    scaled(60_000),
  );
});

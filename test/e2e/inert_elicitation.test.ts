// `elicitation: true` with no client_form rule asks nothing (only such a rule is decided in the
// client): a config written for an earlier release that counted on it is told, by a warning at
// start-up and a note from `tpu-mcp config show`, instead of changing behaviour without a word.
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../server/config/config.js";
import { inertSettings } from "../../server/config/inert.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CLI, ROOT, cli, scaledRequests, writeConfig } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const NOTE =
  /policy\.approvals\.elicitation is true, but no approval rule has "assurance": "client_form"/;
const rules = (...assurance: string[]) =>
  assurance.map((a) => ({ tool: "run_benchmark", assurance: a }));

/** The notes for a policy section as a file would write it. */
function notes(approvals: Record<string, unknown>): string[] {
  const raw = { policy: { approvals } };
  return inertSettings(parseConfig(raw, { root: ROOT }), raw);
}

describe("elicitation: true without a client_form rule", () => {
  it("is noted when written, with the default rules or token/passkey ones", () => {
    expect(notes({ elicitation: true })).toEqual([expect.stringMatching(NOTE)]);
    expect(notes({ elicitation: true, rules: rules("token", "passkey") })).toHaveLength(1);
    expect(notes({ elicitation: true })[0]).toMatch(
      /Add "assurance": "client_form".*or remove "elicitation"/,
    );
  });

  it("is not noted where it does something, is off, or is only the default", () => {
    expect(notes({ elicitation: true, rules: rules("token", "client_form") })).toEqual([]);
    expect(notes({ elicitation: false })).toEqual([]);
    expect(notes({})).toEqual([]); // not written: the default says nothing
    expect(inertSettings(parseConfig({}, { root: ROOT }))).toEqual([]); // no file at all
  });

  const config = writeConfig({ policy: { approvals: { elicitation: true } } });
  let client: Client | undefined;
  afterAll(() => client?.close());

  it("`config show` prints the config on stdout and the note on stderr", async () => {
    const r = await cli(config, "config", "show");
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).policy.approvals.elicitation).toBe(true);
    expect(r.stderr).toMatch(new RegExp(`note: ${NOTE.source}`));
  });

  it("the server warns at start-up", { timeout: scaled(120_000) }, async () => {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [CLI, "stdio", "--config", config],
      cwd: ROOT,
      stderr: "pipe",
    });
    let stderr = "";
    transport.stderr?.on("data", (d) => (stderr += d));
    client = scaledRequests(new Client({ name: "inert-test", version: "0" }));
    await client.connect(transport);
    // Answering tools/list means started: the warning came before initialize was answered.
    await client.listTools();
    const warnings = stderr
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l))
      .filter((l) => l.level === 40);
    expect(warnings.map((w) => w.msg)).toContainEqual(expect.stringMatching(NOTE));
  });
});

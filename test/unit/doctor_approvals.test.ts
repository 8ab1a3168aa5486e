// `tpu-mcp doctor` says what the approval rules are worth where it finds the data dir (issue 21):
// a passkey rule is only as strong as the server's user separation, so with the data dir owned by
// the doctor's user (where an agent runs) it warns that a process of that user can enrol its own
// authenticator; with the data dir another user's it says the passkey rules hold.
import { describe, expect, it } from "vitest";
import { describeApprovals } from "../../server/doctor/approvals.js";
import type { DataDirSituation } from "../../server/doctor/data_dir.js";

const dir = "/var/lib/tpu-mcp";
const own: DataDirSituation = { kind: "own-user", dir, mode: "700", uid: 1000 };
const other: DataDirSituation = { kind: "other-user", dir, mode: "700", uid: 999, root: false };
const missing: DataDirSituation = { kind: "missing", dir };
const shared: DataDirSituation = { kind: "writable-by-others", dir, mode: "777", uid: 1000 };

const passkeyRule = { tool: "run_benchmark", assurance: "passkey" as const };
const tokenRule = { tool: "load_model", assurance: "token" as const };

describe("the doctor on approval rules", () => {
  it("warns that passkey rules are only as strong as the user separation when the data dir is yours", () => {
    const [line] = describeApprovals([passkeyRule], own);
    expect(line.level).toBe("warn");
    expect(line.text).toMatch(/passkey rule\(s\) \(run_benchmark\)/);
    expect(line.text).toMatch(/only as strong as the server's user separation/);
    expect(line.text).toMatch(/owned by you/);
    expect(line.text).toMatch(/operators enrol/);
    expect(line.text).toMatch(/Run the server as its own user/);
    // The doctor cannot tell the operator's user from a dedicated one: it says how to check.
    expect(line.text).toMatch(/run the doctor as the user your agents run as/);
  });

  it("says passkey rules hold when the data dir is another user's (and what root still can)", () => {
    const [line] = describeApprovals([passkeyRule], other);
    expect(line.level).toBe("ok");
    expect(line.text).toMatch(
      /decided only in the console with an enrolled, user-verified passkey/,
    );
    expect(line.text).toMatch(/cannot enrol a passkey/);
    expect(line.text).not.toMatch(/root/);
    const [asRoot] = describeApprovals([passkeyRule], { ...other, root: true });
    expect(asRoot.text).toMatch(/you are root: root still can/);
  });

  it("warns for passkey rules before the data dir exists, and when others can write it", () => {
    expect(describeApprovals([passkeyRule], missing)[0]).toMatchObject({
      level: "warn",
      text: expect.stringMatching(/as strong as the separation of the user that first runs/),
    });
    expect(describeApprovals([passkeyRule], shared)[0]).toMatchObject({
      level: "warn",
      text: expect.stringMatching(/hold nothing while other users can write/),
    });
  });

  it("never credits a token rule with the server's separation: a token anywhere approves it", () => {
    const [mine] = describeApprovals([tokenRule], own);
    expect(mine.level).toBe("warn");
    expect(mine.text).toMatch(/a process of yours can read one there and approve/);
    const [theirs] = describeApprovals([tokenRule], other);
    expect(theirs.text).toMatch(/a token in your files or environment still approves them/);
    expect(theirs.text).toMatch(/"assurance": "passkey"/);
    // A rule without assurance (an older config object) is a token rule.
    expect(describeApprovals([{ tool: "x" }], other)[0].text).toMatch(/^token rule/);
  });

  it("reports both kinds of rule, and nothing when approvals are off", () => {
    const lines = describeApprovals([passkeyRule, tokenRule], other);
    expect(lines.map((l) => l.text.split(":")[0])).toEqual([
      "passkey rule(s) (run_benchmark)",
      "token rule(s) (load_model)",
    ]);
    expect(describeApprovals([], own)).toEqual([]);
  });

  it("says a client_form rule is approved by whoever answers the client's form, wherever the server runs", () => {
    const formRule = { tool: "check_model", assurance: "client_form" as const };
    for (const where of [own, other]) {
      const [line] = describeApprovals([formRule], where);
      expect(line.level).toBe("warn");
      expect(line.text).toMatch(/^client_form rule\(s\) \(check_model\)/);
      expect(line.text).toMatch(/approved by whoever answers the client's form/);
      expect(line.text).toMatch(
        /an agent that answers its own client's prompts approves its own calls/,
      );
    }
    // With approvals.elicitation false nobody is asked in band: it is a token rule then.
    const [off] = describeApprovals([formRule], other, false);
    expect(off.text).toMatch(/^token rule\(s\) \(check_model\)/);
  });
});

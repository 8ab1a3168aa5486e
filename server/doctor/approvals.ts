// What the approval rules are worth where the doctor finds the data dir. A passkey rule is only
// as strong as the separation between the server's user and the agent's: a process that can write
// the data dir can add its own credential to the store or run `tpu-mcp operators enrol` and enrol
// a software authenticator. A token rule holds against whoever lacks an approvals:grant token,
// wherever the server runs. So the doctor says, per assurance, what the situation means.
import { clientFormText } from "../../policies/gate/answers.js";
import type { DataDirSituation } from "./data_dir.js";

export interface RuleView {
  tool: string;
  assurance?: "client_form" | "token" | "passkey";
}

export interface ApprovalsFinding {
  level: "ok" | "warn";
  text: string;
}

const SEPARATE = "docs/security.md, 'Run the server as its own user'";

/** The lines the doctor prints about the approval rules (none when approvals are off). */
export function describeApprovals(
  rules: readonly RuleView[],
  situation: DataDirSituation,
  /** `approvals.elicitation`: false asks nobody in band, so a client_form rule is a token one. */
  elicitation = true,
): ApprovalsFinding[] {
  if (rules.length === 0) return [];
  if (!elicitation)
    rules = rules.map((r) => (r.assurance === "client_form" ? { ...r, assurance: "token" } : r));
  const passkey = rules.filter((r) => r.assurance === "passkey").map((r) => r.tool);
  const token = rules.filter((r) => (r.assurance ?? "token") === "token").map((r) => r.tool);
  const clientForm = rules.filter((r) => r.assurance === "client_form").map((r) => r.tool);
  const out: ApprovalsFinding[] = [];
  // Wherever the server runs: the agent answers its own client's form unless a person does.
  if (clientForm.length > 0) out.push({ level: "warn", text: clientFormText(clientForm) });
  if (passkey.length > 0) {
    const what = `passkey rule(s) (${passkey.join(", ")})`;
    switch (situation.kind) {
      case "own-user":
        out.push({
          level: "warn",
          text:
            `${what} are only as strong as the server's user separation, and the data dir is owned by you: ` +
            "a process of yours (a coding agent with a shell included) can run `tpu-mcp operators enrol` and enrol a software authenticator, or write the credential store, then sign decisions itself. " +
            `Run the server as its own user (${SEPARATE}); if this is that user (sudo -u tpu-mcp), run the doctor as the user your agents run as to see what they reach.`,
        });
        break;
      case "writable-by-others":
        out.push({
          level: "warn",
          text: `${what} hold nothing while other users can write the data dir: any of them can add a credential to the store`,
        });
        break;
      case "missing":
        out.push({
          level: "warn",
          text:
            `${what} will be as strong as the separation of the user that first runs the server: ` +
            `run it as its own user, not as the user an agent runs as (${SEPARATE})`,
        });
        break;
      case "other-user":
        out.push({
          level: "ok",
          text:
            `${what}: decided only in the console with an enrolled, user-verified passkey; the data dir is another user's, so your processes cannot enrol a passkey or write the credential store` +
            (situation.root ? " (you are root: root still can)" : ""),
        });
        break;
    }
  }
  if (token.length > 0) {
    const what = `token rule(s) (${token.join(", ")})`;
    const base = `${what}: decided by whoever holds an approvals:grant token`;
    if (situation.kind === "own-user")
      out.push({
        level: "warn",
        text: `${base}; with the data dir yours, a process of yours can read one there and approve (require "assurance": "passkey" and run the server as its own user to keep agents out)`,
      });
    else
      out.push({
        level: "ok",
        text: `${base}, wherever it is kept: a token in your files or environment still approves them (require "assurance": "passkey" where an agent may find one)`,
      });
  }
  return out;
}

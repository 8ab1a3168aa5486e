// Settings a config file writes that do nothing under the rest of it, each told in a sentence at
// start-up and by `tpu-mcp config show`: a config written for an earlier release may count on one,
// and its behaviour would change without a word.
import { readFileSync } from "node:fs";
import type { ServerConfig } from "./config.js";

/** The file as written (the parsed config cannot tell a default from a value the user gave). */
function fileAsWritten(config: ServerConfig): unknown {
  if (!config.paths.config_file) return {};
  try {
    return JSON.parse(readFileSync(config.paths.config_file, "utf8"));
  } catch {
    return {}; // loadConfig already refused a file it could not read
  }
}

export function inertSettings(
  config: ServerConfig,
  raw: unknown = fileAsWritten(config),
): string[] {
  const notes: string[] = [];
  const approvals = config.policy.approvals;
  const written = (raw as any)?.policy?.approvals?.elicitation;
  // Only a client_form rule is ever asked in the client: the agent may be the one answering.
  if (written === true && !approvals.rules.some((r) => r.assurance === "client_form"))
    notes.push(
      `policy.approvals.elicitation is true, but no approval rule has "assurance": "client_form", so no call is ever asked in the client: only such a rule is decided by an answer to the client's form (whoever answers it, the agent included), every other rule waits for an operator. Add "assurance": "client_form" to the rules a user's answer may decide, or remove "elicitation" (docs/policies-and-approvals.md#assurance-levels-token-or-passkey).`,
    );
  return notes;
}

// `tpu-mcp operators enrol NAME | list | remove NAME`: the operators' passkeys, from a shell as
// the server's user (whoever can run this can also read the server's files: these commands are
// the trust root, and the deployment keeps the agent's OS user away from them, docs/security.md).
//   enrol   prints a one-time code for NAME's first passkey (expires in
//           policy.passkeys.enrolment_code_ttl_s); refused once NAME has any passkey. With
//           passkeys enrolled already, the new one still waits for an existing passkey's approval.
//   list    the passkeys (read-only).
//   remove  retires NAME's passkeys (kept for audit verify, never sign again): the recovery for a
//           lost authenticator (audited).
import type { Logger } from "pino";
import { isPolicyError } from "../../policies/errors.js";
import { createPolicyServices, publicConsoleUrl } from "../app/build_policies.js";
import { readPasskeys } from "../app/storage.js";
import type { ServerConfig } from "../config/config.js";
import { terminalField } from "../terminal.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
}

const USAGE = "usage: tpu-mcp operators enrol NAME | list | remove NAME";

function validName(name: string | undefined): name is string {
  return (
    typeof name === "string" &&
    name.length > 0 &&
    name.length <= 256 &&
    !name.startsWith("jwt:") &&
    !/[\u0000-\u001f\u007f-\u009f]/.test(name)
  );
}

export async function runOperatorsCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io,
): Promise<number> {
  const [sub, name] = positionals;
  if (sub === "list") return list(config, io);
  if ((sub === "enrol" || sub === "enroll" || sub === "remove") && name !== undefined) {
    if (!validName(name)) {
      io.err("NAME: 1-256 characters, no control characters, not starting with jwt:");
      return 2;
    }
    const policy = await createPolicyServices(config, io.logger);
    const audit = (reason: string) =>
      policy.audit.append({
        time: new Date().toISOString(),
        principal: `cli:${name}`,
        tool: "passkeys",
        args_digest: null,
        outcome: "allowed",
        reason,
      });
    try {
      if (sub === "remove") {
        const n = await policy.passkeys.removeOperator(name);
        await audit(`${n} passkey(s) of ${name} removed from the command line`);
        io.out(n ? `removed ${n} passkey(s) of ${name}` : `${name} has no passkey`);
        return 0;
      }
      const { code, expires_at } = await policy.passkeys.createEnrolmentCode(
        name,
        config.policy.passkeys.enrolment_code_ttl_s,
      );
      const others = await policy.passkeys.activeCount();
      await audit(`enrolment code for ${name} printed (expires ${expires_at})`);
      if (io.json) {
        io.out(JSON.stringify({ operator: name, code, expires_at, needs_approval: others > 0 }));
        return 0;
      }
      const where = publicConsoleUrl(config.http.resource_url) ?? "the console (/console/)";
      io.out(
        [
          `enrolment code for ${terminalField(name)} (single use, expires ${expires_at}):`,
          `  ${code}`,
          `open ${where} in a browser on http://localhost or https://<host name> (passkeys need a secure context, not a bare IP),`,
          `choose "Enrol a passkey" and paste the code.`,
          others > 0
            ? `${others} passkey(s) are enrolled already: the new one works once an operator approves it with theirs (Passkeys page).`
            : "This is the first passkey: it works at once.",
        ].join("\n"),
      );
      return 0;
    } catch (e) {
      if (!isPolicyError(e)) throw e;
      io.err(`${e.code}: ${e.message}`);
      return 1;
    } finally {
      await policy.close();
    }
  }
  io.err(USAGE);
  return 2;
}

async function list(config: ServerConfig, io: Io): Promise<number> {
  const store = await readPasskeys(config);
  if (!store) {
    io.out(io.json ? "[]" : "no passkeys");
    return 0;
  }
  try {
    const all = (await store.passkeys.list()).map((c) => ({
      id: c.id,
      operator: c.operator,
      status: c.status,
      aaguid: c.aaguid,
      counter: c.counter,
      created_at: c.created_at,
      last_used_at: c.last_used_at,
    }));
    if (io.json) io.out(JSON.stringify(all, null, 2));
    else if (all.length === 0) io.out("no passkeys");
    else
      for (const c of all)
        io.out(
          terminalField(
            `${c.operator}  ${c.status.padEnd(7)} ${c.id}  created ${c.created_at}  last used ${c.last_used_at ?? "never"}`,
          ),
        );
    return 0;
  } finally {
    await store.close();
  }
}

// `tpu-mcp principals list | suspended | resume ID`: who may call (the config's principals) and
// who an alert rule suspended (policy.db, beside a running server). Resuming is an operator's
// decision, made with a token holding approvals:grant or admin and audited as such.
import type { Logger } from "pino";
import { hasScope } from "../../policies/scopes.js";
import type { Suspension } from "../../policies/suspensions.js";
import { createPolicyServices } from "../app/build_policies.js";
import type { ServerConfig } from "../config/config.js";
import { readSuspensions } from "../app/storage.js";
import { terminalField } from "../terminal.js";
import { principalOfToken } from "./token.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
  token?: string;
}

const USAGE = "usage: tpu-mcp principals list | suspended | resume ID [--token T]";

const describe = (s: Suspension) =>
  terminalField(
    `${s.principal}  suspended since ${s.since} by ${s.rule}, ${s.until ? `until ${s.until}` : "until resumed"} — ${s.reason}`,
  );

export async function runPrincipalsCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io,
): Promise<number> {
  const [sub, id] = positionals;
  if (sub === "list" || sub === "suspended") return show(config, sub, io);
  if (sub === "resume" && id) return resume(config, id, io);
  io.err(USAGE);
  return 2;
}

async function show(config: ServerConfig, sub: "list" | "suspended", io: Io): Promise<number> {
  const suspended = await readSuspensions(config, Date.now());
  if (sub === "suspended") {
    if (io.json) io.out(JSON.stringify(suspended, null, 2));
    else
      io.out(suspended.length ? suspended.map(describe).join("\n") : "no principal is suspended");
    return 0;
  }
  // Every principal the config names (JWT subjects are not known until they call), suspended
  // ones included, and the suspended ones the config does not name (a JWT subject).
  const byId = new Map(suspended.map((s) => [s.principal, s]));
  const p = config.policy;
  const rows = [
    { id: p.stdio_principal.id, via: "stdio", scopes: p.stdio_principal.scopes },
    ...p.tokens.map((t) => ({ id: t.id, via: "token", scopes: t.scopes })),
  ];
  const named = new Set(rows.map((r) => r.id));
  const list = [
    ...rows.map((r) => ({ ...r, suspension: byId.get(r.id) ?? null })),
    ...suspended
      .filter((s) => !named.has(s.principal))
      .map((s) => ({ id: s.principal, via: "jwt", scopes: [] as string[], suspension: s })),
  ];
  if (io.json) {
    io.out(JSON.stringify(list, null, 2));
    return 0;
  }
  for (const r of list)
    io.out(
      terminalField(
        `${r.id}  (${r.via}) ${r.scopes.join(" ")}${r.suspension ? `  SUSPENDED ${r.suspension.until ? `until ${r.suspension.until}` : "until resumed"} by ${r.suspension.rule}` : ""}`,
      ),
    );
  return 0;
}

async function resume(config: ServerConfig, id: string, io: Io): Promise<number> {
  const operator = await principalOfToken(
    config,
    io,
    "an operator token is required: --token TOKEN or TPU_MCP_TOKEN (a principal with approvals:grant or admin)",
  );
  if (typeof operator === "number") return operator;
  if (!hasScope(operator, "approvals:grant")) {
    io.err(`${operator.id} may not resume principals: it needs approvals:grant or admin`);
    return 1;
  }
  const policy = await createPolicyServices(config, io.logger);
  try {
    const was = await policy.gate.resumePrincipal(id, operator);
    if (!was) {
      io.err(`${id} is not suspended`);
      return 1;
    }
    io.out(
      io.json
        ? JSON.stringify(was, null, 2)
        : terminalField(`resumed ${id} (was: ${describe(was)})`),
    );
    return 0;
  } finally {
    await policy.close();
  }
}

// The principal behind a CLI command's --token (or TPU_MCP_TOKEN), authenticated as the server
// would: the operator commands (approvals approve|deny, principals resume, workers) share it.
import { Authenticator } from "../../policies/auth.js";
import type { Principal } from "../../policies/scopes.js";
import type { ServerConfig } from "../config/config.js";

interface Io {
  token?: string;
  err(s: string): void;
}

/**
 * The token's principal, or the exit code after saying why: 2 with `missing` (what token the
 * command needs) when none was given, 1 when the token is refused.
 */
export async function principalOfToken(
  config: ServerConfig,
  io: Io,
  missing: string,
): Promise<Principal | number> {
  if (!io.token) {
    io.err(missing);
    return 2;
  }
  try {
    return await new Authenticator(config.policy).authenticate(io.token);
  } catch (e) {
    io.err(`the token was refused: ${(e as Error).message}`);
    return 1;
  }
}

// stdio transport for desktop assistants: one connection, the principal named in the config. The
// connection's opening pins its protocol era (the SDK's serveStdio): `initialize` → a 2025-11-25
// session served by one server; a 2026-07-28 request (or `server/discover`) → per-request servers.
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import type { Principal } from "../../policies/scopes.js";
import type { App } from "../app/app.js";
import { createMcpServer } from "../mcp/server.js";
import { AnsweringStdioServerTransport } from "./stdio_transport.js";

export async function startStdio(app: App): Promise<{ closed: Promise<void> }> {
  // Not before what a killed server left running is settled (reconcile.ts).
  await app.ready;
  const p = app.config.policy.stdio_principal;
  const principal: Principal = { id: p.id, scopes: p.scopes as any, via: "stdio" };
  const transport = new AnsweringStdioServerTransport(undefined, undefined, undefined, {
    trace: app.config.trace_calls,
  });
  const closed = new Promise<void>((resolve) => {
    process.stdin.once("end", () => resolve());
  });
  const handle = serveStdio(({ era }) => createMcpServer(app, principal, era), {
    legacy: "serve",
    transport,
    onerror: (err) =>
      app.logger.warn({ err: String(err).split("\n")[0].slice(0, 300) }, "stdio: protocol error"),
  });
  void closed.then(() => handle.close().catch(() => {}));
  return { closed };
}

// stdio transport for desktop assistants: one session, the principal named in the config.
import type { Principal } from "../../policies/scopes.js";
import type { App } from "../app/app.js";
import { createMcpServer } from "../mcp/server.js";
import { AnsweringStdioServerTransport } from "./stdio_transport.js";

export async function startStdio(app: App): Promise<{ closed: Promise<void> }> {
  const p = app.config.policy.stdio_principal;
  const principal: Principal = { id: p.id, scopes: p.scopes as any, via: "stdio" };
  const server = createMcpServer(app, principal);
  const transport = new AnsweringStdioServerTransport(undefined, undefined, undefined, {
    trace: app.config.trace_calls,
  });
  const closed = new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    process.stdin.once("end", () => resolve());
  });
  await server.connect(transport);
  return { closed };
}

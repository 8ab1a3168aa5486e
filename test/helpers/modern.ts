// Clients of the 2026-07-28 era: the official SDK v2 client, pinned to that revision (a pin
// never falls back to initialize) or in its `auto` negotiation, over stdio and HTTP. The HTTP
// client can record every request it sends, so hostile tests can replay or alter them.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { scaled } from "./calibrate.js";
import { CLI, ROOT } from "./server.js";

export const MODERN = "2026-07-28";
type ClientOpts = NonNullable<ConstructorParameters<typeof Client>[1]>;
/** `pin`: 2026-07-28 or nothing; `auto`: probe, fall back; `default`: the 2025 handshake. */
export type Negotiation = "pin" | "auto" | "default";

function options(mode: Negotiation, extra: ClientOpts): ClientOpts {
  if (mode === "default") return extra;
  return {
    ...extra,
    versionNegotiation: { mode: mode === "pin" ? { pin: MODERN } : "auto" },
  } as ClientOpts;
}

export interface SentRequest {
  headers: Record<string, string>;
  body: any;
}

export async function connectModernHttp(
  url: string,
  token: string | undefined,
  opts: { mode?: Negotiation; client?: ClientOpts; sent?: SentRequest[] } = {},
) {
  const headers: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers },
    fetch: async (input: string | URL | Request, init?: RequestInit) => {
      if (opts.sent && init?.method === "POST" && typeof init.body === "string") {
        opts.sent.push({
          headers: Object.fromEntries(new Headers(init.headers).entries()),
          body: JSON.parse(init.body),
        });
      }
      return fetch(input, init);
    },
  });
  const client = new Client(
    { name: "tpu-mcp-modern-test", version: "0.0.0" },
    options(opts.mode ?? "pin", opts.client ?? {}),
  );
  await client.connect(transport);
  return { client, close: () => client.close() };
}

export async function connectModernStdio(
  configFile: string,
  opts: { mode?: Negotiation; client?: ClientOpts } = {},
) {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI, "stdio", "--config", configFile],
    cwd: ROOT,
    stderr: "pipe",
  });
  const client = new Client(
    { name: "tpu-mcp-modern-test", version: "0.0.0" },
    options(opts.mode ?? "pin", opts.client ?? {}),
  );
  await client.connect(transport);
  return { client, close: () => client.close() };
}

export async function callModern(
  client: Client,
  name: string,
  args: Record<string, unknown>,
  opts: Record<string, unknown> = {},
): Promise<any> {
  return client.callTool({ name, arguments: args }, { timeout: scaled(300_000), ...opts } as any);
}

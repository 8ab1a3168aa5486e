// The MCP Registry entry (server.json, schema 2025-12-11), generated from package.json and the
// tool registry so that it cannot drift from either: `npx tsx scripts/server_json.ts` rewrites
// server.json; test/package/registry.test.ts checks the committed file is what this makes and
// that it validates against the vendored schema.
//
// The publisher's namespace is a PLACEHOLDER until tpu-mcp has one: package.json's `mcpName`
// (io.github.tpu-mcp/tpu-mcp). Change it there (and the image name below) before publishing;
// the registry checks npm's `mcpName` and the image's io.modelcontextprotocol.server.name label.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TOOL_POLICIES } from "../tools/registry.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const SERVER_JSON = join(ROOT, "server.json");
export const SCHEMA_URL =
  "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json";

/** The image examples/deploy/Containerfile builds, under the same placeholder namespace. */
export function imageName(version: string): string {
  return `ghcr.io/tpu-mcp/tpu-mcp:${version}`;
}

/** What a user may set, for both packages (the server reads no other variable). */
const ENVIRONMENT = [
  {
    name: "TPU_MCP_CONFIG",
    description:
      "Path of a JSON config file (catalog, policy, limits); unset: the built-in defaults.",
    format: "filepath",
  },
  {
    name: "TPU_MCP_HOME",
    description:
      "The per-user folder for the Python environment, model files and server data; default $XDG_DATA_HOME/tpu-mcp.",
    format: "filepath",
  },
  {
    name: "TPU_MCP_LOG_LEVEL",
    description: "Log level on stderr.",
    choices: ["fatal", "error", "warn", "info", "debug", "trace"],
    default: "info",
  },
];

export function serverJson(): Record<string, unknown> {
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const tools = TOOL_POLICIES.map((p) => p.name);
  return {
    $schema: SCHEMA_URL,
    name: pkg.mcpName,
    title: "tpu-mcp",
    // The schema allows 100 characters: the package's description cut at its first clause.
    description:
      "Policy-gated tools to inspect, load, run and benchmark PyTorch models on TPU, CUDA or CPU.",
    version: pkg.version,
    packages: [
      {
        registryType: "npm",
        registryBaseUrl: "https://registry.npmjs.org",
        identifier: pkg.name,
        version: pkg.version,
        runtimeHint: "npx",
        transport: { type: "stdio" },
        packageArguments: [{ type: "positional", value: "stdio" }],
        environmentVariables: ENVIRONMENT,
      },
      {
        registryType: "oci",
        identifier: imageName(pkg.version),
        runtimeHint: "docker",
        runtimeArguments: [
          { type: "named", name: "-p", value: "127.0.0.1:7801:7801" },
          { type: "named", name: "-v", value: "tpu-mcp-data:/data" },
        ],
        transport: {
          type: "streamable-http",
          url: "http://127.0.0.1:7801/mcp",
          headers: [
            {
              name: "Authorization",
              description: "The bearer token the container prints at start (docker logs).",
              value: "Bearer {token}",
              isRequired: true,
              isSecret: true,
              variables: { token: { isRequired: true, isSecret: true } },
            },
          ],
        },
        environmentVariables: ENVIRONMENT.filter((e) => e.name !== "TPU_MCP_HOME"),
      },
    ],
    _meta: {
      "io.modelcontextprotocol.registry/publisher-provided": {
        tools,
        license: pkg.license,
        protocolVersions: ["2025-11-25", "2026-07-28"],
      },
    },
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(SERVER_JSON, JSON.stringify(serverJson(), null, 2) + "\n");
  process.stderr.write(`[server.json] ${SERVER_JSON}\n`);
}

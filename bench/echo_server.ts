// The SDK floor for the decomposition (bench/decompose.ts): an MCP server with one `echo` tool on
// the same stdio transport tpu-mcp uses, no gate, no audit, no runtime. It takes the arguments a
// run_inference call takes and answers with a result of the same shape (an output schema
// included, so the client validates it as it does tpu-mcp's), so what a real call costs beyond
// this is what tpu-mcp adds. Run by the bench only: `tsx bench/echo_server.ts`.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { AnsweringStdioServerTransport } from "../server/transports/stdio_transport.js";

const outputSchema = {
  type: "object",
  properties: {
    model: { type: "string" },
    task: { type: "string" },
    items: { type: "number" },
    outputs: {
      type: "array",
      items: {
        type: "object",
        properties: {
          name: { type: "string" },
          shape: { type: "array", items: { type: "number" } },
          dtype: { type: "string" },
          data: { type: "array", items: { type: "number" } },
        },
        required: ["name", "shape", "dtype"],
      },
    },
    elapsed_ms: { type: "number" },
  },
  required: ["model", "task", "items", "outputs", "elapsed_ms"],
};

async function main() {
  const server = new Server({ name: "echo", version: "0.0.0" }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: [
      {
        name: "echo",
        description: "answers with a result shaped like run_inference's",
        inputSchema: { type: "object" },
        outputSchema: outputSchema as any,
      },
    ],
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const args = (req.params.arguments ?? {}) as { model?: string; out?: number };
    const n = typeof args.out === "number" ? args.out : 10;
    const out = {
      model: String(args.model ?? "echo"),
      task: "tensor",
      items: 1,
      outputs: [
        {
          name: "output_0",
          shape: [1, n],
          dtype: "float32",
          data: Array.from({ length: n }, (_, i) => i / n),
        },
      ],
      elapsed_ms: 0,
    };
    return { content: [{ type: "text", text: "echo" }], structuredContent: out };
  });
  const transport = new AnsweringStdioServerTransport();
  await server.connect(transport);
}

main().catch((e) => {
  process.stderr.write(`echo server failed: ${String(e)}\n`);
  process.exit(1);
});

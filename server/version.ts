// The server's name and version, as MCP initialize and `tpu-mcp doctor` report them. A leaf:
// anything in server/ may import it without pulling in the MCP handlers.
export const SERVER_NAME = "tpu-mcp";
export const SERVER_VERSION = "0.3.0";

/** The server's identity as MCP carries it (initialize, and every 2026-07-28 result's _meta). */
export const SERVER_INFO = {
  name: SERVER_NAME,
  version: SERVER_VERSION,
  title: "tpu-mcp: PyTorch on TPU, CUDA or CPU for agents",
};

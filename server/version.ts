// The server's name and version, as MCP initialize and `tpu-mcp doctor` report them. A leaf:
// anything in server/ may import it without pulling in the MCP handlers.
export const SERVER_NAME = "tpu-mcp";
export const SERVER_VERSION = "0.3.0";

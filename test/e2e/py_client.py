"""A Python MCP SDK client (the `mcp` package) driving tpu-mcp, for test/e2e/python_client.test.ts.

Connects over stdio or Streamable HTTP in the era asked for (`legacy`: the initialize handshake;
`auto`: probe server/discover; `2026-07-28`: that revision, no probe), answers an approval form
by accepting it, runs a short journey and prints one JSON line of what it saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def accept(_ctx, params) -> types.ElicitResult:
    prompts.append(params.message)
    return types.ElicitResult(action="accept", content={"approve": True})


prompts: list[str] = []


def structured(result) -> dict:
    if result.is_error:
        meta = (result.meta or {}).get("tpu-mcp/error", {})
        raise SystemExit(f"tool error {meta.get('code')}: {meta.get('message')}")
    return result.structured_content or {}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=["stdio", "http"], required=True)
    ap.add_argument("--mode", default="legacy")
    ap.add_argument("--cli")
    ap.add_argument("--config")
    ap.add_argument("--url")
    ap.add_argument("--token")
    a = ap.parse_args()

    if a.transport == "stdio":
        server = StdioServerParameters(command="node", args=[a.cli, "stdio", "--config", a.config])
    else:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {a.token}"}, timeout=300)
        server = streamable_http_client(a.url, http_client=http)

    async with Client(server, mode=a.mode, elicitation_callback=accept, read_timeout_seconds=300) as c:
        tools = await c.list_tools()
        models = structured(await c.call_tool("list_models", {}))
        loaded = structured(await c.call_tool("load_model", {"model": "mnist-cnn"}))
        image = {"dtype": "float32", "shape": [1, 1, 28, 28], "data": [0.0] * 784}
        inferred = structured(await c.call_tool("run_inference", {"model": "mnist-cnn", "tensors": [image]}))
        structured(await c.call_tool("unload_model", {"model": "mnist-cnn"}))
        print(
            json.dumps(
                {
                    "protocol_version": c.protocol_version,
                    "tools": sorted(t.name for t in tools.tools),
                    "models": [m["id"] for m in models["models"]],
                    "loaded": loaded.get("model"),
                    "inference_keys": sorted(inferred.keys()),
                    "prompts": prompts,
                }
            )
        )


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except SystemExit as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(1)

// What an agent pays for: the bytes of a JSON-RPC result exactly as the server sent it (the
// message the client's transport received, before the SDK parses it), and a token estimate.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";

/** The estimator the bench and the size test state: ~4 bytes of JSON per token (no tokenizer is installed). */
export const BYTES_PER_TOKEN = 4;
export const tokensOf = (bytes: number) => Math.ceil(bytes / BYTES_PER_TOKEN);

/**
 * Runs `request` on a connected client and returns its value with the UTF-8 size of the result
 * the server answered (the last JSON-RPC response that arrived while it ran).
 */
export async function wireSize<T>(
  client: Client,
  request: () => Promise<T>,
): Promise<{ value: T; bytes: number }> {
  const transport = client.transport;
  if (!transport?.onmessage) throw new Error("wireSize: the client is not connected");
  const deliver = transport.onmessage;
  let bytes = -1;
  transport.onmessage = (message, extra) => {
    if ("result" in message) bytes = Buffer.byteLength(JSON.stringify(message.result));
    deliver.call(transport, message, extra);
  };
  try {
    const value = await request();
    if (bytes < 0) throw new Error("wireSize: no response arrived");
    return { value, bytes };
  } finally {
    transport.onmessage = deliver;
  }
}

// What a client's transport receives, for the checks the SDK hides: it hands progress
// notifications to `onprogress` a microtask after the answer when both arrive in one read
// (typescript-sdk#2580), so a test that wants every delta reads them off the wire instead.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";

/** Every message the client's transport receives from now on, in order. */
export function tapMessages(client: Client): JSONRPCMessage[] {
  const seen: JSONRPCMessage[] = [];
  const transport = client.transport!;
  const deliver = transport.onmessage!;
  transport.onmessage = (message, extra) => {
    seen.push(message);
    deliver.call(transport, message, extra);
  };
  return seen;
}

/** The progress notifications among received messages: {progress, message}. */
export function progressOf(messages: JSONRPCMessage[]): { progress: number; message?: string }[] {
  return messages
    .filter((m) => "method" in m && m.method === "notifications/progress")
    .map((m) => (m as any).params);
}

// Where the streaming audit sink (audit_sink.ts) sends its lines: a file that rotates by size,
// or an HTTP endpoint (one POST of newline-delimited JSON per batch; the sink retries a batch
// that was not taken, with backoff).

import { createHmac } from "node:crypto";
import { open, rename, stat, type FileHandle } from "node:fs/promises";
import type { SinkTarget } from "./audit_sink.js";

/**
 * Appends to `path` (0600); once it would pass `maxBytes` it is renamed `path.1` (the older ones
 * shift to `.2` … `.keep`, the oldest is overwritten) and a new file started. A line is never
 * split between two files.
 */
export function fileSinkTarget(path: string, maxBytes: number, keep: number): SinkTarget {
  let fh: FileHandle | null = null;
  let size = 0;
  const openFile = async () => {
    fh = await open(path, "a", 0o600);
    size = (await stat(path)).size;
  };
  const rotate = async () => {
    await fh?.close();
    fh = null;
    for (let i = keep - 1; i >= 1; i--)
      await rename(`${path}.${i}`, `${path}.${i + 1}`).catch(() => {});
    await rename(path, `${path}.1`).catch(() => {});
    await openFile();
  };
  return {
    describe: `file ${path}`,
    async send(lines) {
      if (!fh) await openFile();
      // Each batch may span a rotation: cut it where the file would pass its size.
      let chunk: string[] = [];
      let chunkBytes = 0;
      const write = async () => {
        if (chunk.length === 0) return;
        const text = chunk.join("\n") + "\n";
        await fh!.write(text);
        size += Buffer.byteLength(text);
        chunk = [];
        chunkBytes = 0;
      };
      for (const l of lines) {
        const n = Buffer.byteLength(l) + 1;
        if (size + chunkBytes + n > maxBytes && size + chunkBytes > 0) {
          await write();
          await rotate();
        }
        chunk.push(l);
        chunkBytes += n;
      }
      await write();
    },
    async close() {
      await fh?.close();
      fh = null;
    },
  };
}

/**
 * POSTs each batch to `url` as application/x-ndjson; a 2xx answer takes it, anything else (or
 * no answer within the timeout) rejects, and the sink sends the same batch again later. With a
 * secret, each POST is signed as the webhooks are (x-tpu-mcp-timestamp, x-tpu-mcp-signature).
 */
export function httpSinkTarget(
  url: string,
  opts: { timeoutMs?: number; secret?: Buffer } = {},
): SinkTarget {
  return {
    describe: `http ${new URL(url).origin}${new URL(url).pathname}`,
    async send(lines) {
      const body = lines.join("\n") + "\n";
      const ts = String(Math.floor(Date.now() / 1000));
      const headers: Record<string, string> = {
        "content-type": "application/x-ndjson",
        "user-agent": "tpu-mcp-audit-sink/0.1",
      };
      if (opts.secret) {
        headers["x-tpu-mcp-timestamp"] = ts;
        headers["x-tpu-mcp-signature"] =
          `v1=${createHmac("sha256", opts.secret).update(`${ts}.${body}`, "utf8").digest("hex")}`;
      }
      const res = await fetch(url, {
        method: "POST",
        headers,
        body,
        redirect: "error",
        signal: AbortSignal.timeout(opts.timeoutMs ?? 10_000),
      });
      await res.arrayBuffer().catch(() => {});
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
    },
    async close() {},
  };
}

// The control plane's side of the remote-worker channel (runtime/pool/remote.ts) against a TLS
// server of the test's own: a worker certificate from another CA, or for another name, must end
// the connection before the token is sent (whoever holds such a certificate would otherwise
// collect the shared token and answer as the worker), and the right one must get the token.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeCerts, type Certs } from "../helpers/fleet.js";
import { remoteSpawn, type RemoteRefusal } from "../../runtime/pool/remote.js";

const hasOpenssl = spawnSync("openssl", ["version"]).status === 0;
if (!hasOpenssl && process.env.CI === "true")
  throw new Error("openssl is needed to make the certificates (CI=true: not skipping)");

interface Seen {
  refusals: RemoteRefusal[];
  /** Bytes the fake worker received after the handshake (the auth frame with the token, if sent). */
  received: Buffer;
  exitCode: number | null;
}

/** A fake worker presenting `cert`; it records what the control plane sends and never answers. */
async function tryConnect(
  certs: Certs,
  cert: string,
  key: string,
  serverName?: string,
): Promise<Seen> {
  const seen: Seen = { refusals: [], received: Buffer.alloc(0), exitCode: null };
  const server = tls.createServer(
    {
      cert: readFileSync(cert),
      key: readFileSync(key),
      ca: readFileSync(certs.ca),
      requestCert: true,
      rejectUnauthorized: true,
    },
    (s) => {
      s.on("data", (d: Buffer) => {
        seen.received = Buffer.concat([seen.received, d]);
        s.end(); // we only want to know whether the token came
      });
      s.on("error", () => {});
    },
  );
  server.on("tlsClientError", () => {});
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  try {
    const child = remoteSpawn(
      {
        name: "w-remote",
        connect: `127.0.0.1:${port}`,
        tls: {
          ca: certs.ca,
          cert: certs.clientCert,
          key: certs.clientKey,
          ...(serverName ? { server_name: serverName } : {}),
        },
        token_file: certs.token,
      },
      (r) => seen.refusals.push(r),
    )("python", [], {}) as unknown as NodeJS.EventEmitter & { stdout: NodeJS.ReadableStream };
    child.stdout.resume();
    seen.exitCode = await new Promise<number | null>((r) =>
      child.once("exit", (code: number | null) => r(code)),
    );
  } finally {
    await new Promise<void>((r) => server.close(() => r()));
  }
  return seen;
}

const token = (certs: Certs) => readFileSync(certs.token, "utf8").split("\n")[0]!.trim();

describe.skipIf(!hasOpenssl)("the control plane verifies the remote worker's certificate", () => {
  let dir: string;
  let certs: Certs;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "tpu-mcp-remote-tls-"));
    certs = makeCerts(join(dir, "certs"));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("a worker certificate from another CA is refused before the token is sent", async () => {
    const seen = await tryConnect(certs, certs.rogueWorkerCert, certs.rogueWorkerKey);
    expect(seen.received.includes(token(certs))).toBe(false);
    expect(seen.received.length).toBe(0);
    expect(seen.exitCode).toBe(2); // not retried: a certificate problem is configuration
    expect(seen.refusals).toEqual([
      expect.objectContaining({
        worker: "w-remote",
        reason: "tls",
        message: expect.stringMatching(/TLS handshake/),
      }),
    ]);
  });

  it("a worker certificate for another name is refused before the token is sent", async () => {
    const seen = await tryConnect(certs, certs.otherNameWorkerCert, certs.otherNameWorkerKey);
    expect(seen.received.length).toBe(0);
    expect(seen.exitCode).toBe(2);
    expect(seen.refusals).toEqual([
      expect.objectContaining({
        reason: "tls",
        message: expect.stringMatching(/does not match|altnames/i),
      }),
    ]);
  });

  it("tls.server_name is checked too: the right CA and address but another configured name is refused", async () => {
    const seen = await tryConnect(certs, certs.workerCert, certs.workerKey, "elsewhere.example");
    expect(seen.received.length).toBe(0);
    expect(seen.refusals).toEqual([expect.objectContaining({ reason: "tls" })]);
  });

  it("the worker's own certificate, for its address, gets the auth frame with the token", async () => {
    const seen = await tryConnect(certs, certs.workerCert, certs.workerKey);
    // (the fake worker then closes without answering, which the client reports as a refusal)
    expect(seen.received.includes(token(certs))).toBe(true);
  });
});

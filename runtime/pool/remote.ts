// The socket transport: a remote worker (`python -m tpu_worker serve`, TCP + mutual TLS + token)
// presented to WorkerRuntime as if it were a child process, so the one supervisor keeps doing
// everything it does for a pipe — hello, heartbeats, timeouts, cancel, worker_died for calls in
// flight when the connection drops, reconnect ("restart") with backoff, models reported lost.
//
// Mapping: spawn = connect; stdin = the TLS socket's write side; stdout = its read side;
// kill() = destroy the socket; the socket closing = the process exiting. A refusal the worker
// explains (wrong token, busy) or a TLS failure that retrying cannot fix (certificate not
// trusted) ends like a worker that refused its configuration: one `error` frame with id null,
// then exit code 2, so the supervisor fails at once with the reason instead of hammering.
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { PassThrough } from "node:stream";
import tls from "node:tls";
import { encodeFrame } from "../wire/framing.js";
import type { SpawnFn } from "../client.js";

export interface RemoteTls {
  /** CA that signed the worker's certificate (PEM file). */
  ca: string;
  /** The control plane's client certificate and key (PEM files), signed by the worker's client CA. */
  cert: string;
  key: string;
  /** Name to check the worker's certificate against; default: the host of `connect`. */
  server_name?: string;
}

export interface RemoteEndpoint {
  name: string;
  /** host:port */
  connect: string;
  tls: RemoteTls;
  token_file: string;
}

/** Why a remote connection ended badly; the pool audits these. */
export interface RemoteRefusal {
  worker: string;
  address: string;
  reason: "tls" | "unauthorized" | "busy" | "unreachable";
  message: string;
}

export function splitHostPort(connect: string): { host: string; port: number } {
  const i = connect.lastIndexOf(":");
  const host = connect.slice(0, i).replace(/^\[|\]$/g, "");
  const port = Number(connect.slice(i + 1));
  if (i <= 0 || !host || !Number.isInteger(port) || port < 1 || port > 65535)
    throw new Error(`connect: "${connect}" is not host:port (e.g. 10.0.0.5:7900)`);
  return { host, port };
}

/** TLS failures a retry cannot fix: the peer's certificate or ours is not accepted. */
const FATAL_TLS =
  /certificate|CERT_|self.signed|unable to verify|alert (bad|unknown|decrypt|handshake)|Hostname\/IP does not match/i;

class SocketChild extends EventEmitter {
  readonly stdin = new PassThrough();
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  pid: number | undefined = undefined;
  exitCode: number | null = null;
  private socket: tls.TLSSocket | null = null;
  private exited = false;
  private configError: { code: string; message: string } | null = null;

  constructor(
    private readonly ep: RemoteEndpoint,
    private readonly onRefused: (r: RemoteRefusal) => void,
  ) {
    super();
    queueMicrotask(() => this.connect());
  }

  private connect(): void {
    const { host, port } = splitHostPort(this.ep.connect);
    let token: string;
    let creds: { ca: Buffer; cert: Buffer; key: Buffer };
    try {
      token = readFileSync(this.ep.token_file, "utf8").split("\n")[0]!.trim();
      creds = {
        ca: readFileSync(this.ep.tls.ca),
        cert: readFileSync(this.ep.tls.cert),
        key: readFileSync(this.ep.tls.key),
      };
    } catch (e) {
      this.refuse("tls", `cannot read the TLS files or token: ${(e as Error).message}`);
      return;
    }
    const socket = tls.connect({
      host,
      port,
      ...creds,
      servername: this.ep.tls.server_name ?? (/^[\d.:]+$/.test(host) ? undefined : host),
      ...(this.ep.tls.server_name
        ? {
            checkServerIdentity: (_h: string, cert: tls.PeerCertificate) =>
              tls.checkServerIdentity(this.ep.tls.server_name!, cert),
          }
        : {}),
      rejectUnauthorized: true,
      minVersion: "TLSv1.2",
    });
    this.socket = socket;
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 10_000);
    let connected = false;
    /** The worker answered our auth frame with auth_ok: from here on, bytes are frames for the client. */
    let authed = false;
    let answered = false;
    let pending = Buffer.alloc(0);
    socket.once("secureConnect", () => {
      connected = true;
      this.pid = 0;
      socket.write(Buffer.concat(encodeFrame({ type: "auth", token })));
      this.stdin.pipe(socket);
    });
    socket.on("error", (e: NodeJS.ErrnoException) => {
      const text = `${e.message} ${e.code ?? ""}`;
      if (!answered && FATAL_TLS.test(text)) {
        this.refuse(
          "tls",
          connected
            ? `the worker at ${this.ep.connect} rejected our client certificate (${e.message}); use one signed by its --client-ca`
            : `TLS handshake with ${this.ep.connect} failed (${e.message}); check tls.ca and the worker's certificate`,
        );
      } else if (!connected) {
        this.onRefused({
          worker: this.ep.name,
          address: this.ep.connect,
          reason: "unreachable",
          message: text.trim(),
        });
        // Like a failed spawn: no pid, an `error` event, no exit; the supervisor backs off.
        this.exited = true;
        this.emit("error", e);
      }
      // Otherwise `close` follows: a lost connection, i.e. a worker exit.
    });
    socket.on("data", (chunk: Buffer) => {
      if (authed) {
        this.stdout.write(chunk);
        return;
      }
      // The worker's answer to our auth frame: auth_ok, or an error (unauthorized, busy).
      pending = Buffer.concat([pending, chunk]);
      if (pending.length < 8) return;
      const hl = pending.readUInt32BE(0);
      const bl = pending.readUInt32BE(4);
      if (hl > 4096 || bl !== 0) {
        answered = true;
        authed = true; // not our auth answer: let the client's decoder judge the stream
        this.stdout.write(pending);
        return;
      }
      if (pending.length < 8 + hl) return;
      answered = true;
      let h: any = null;
      try {
        h = JSON.parse(pending.subarray(8, 8 + hl).toString("utf8"));
      } catch {
        /* judged below */
      }
      const frame = pending.subarray(0, 8 + hl);
      const rest = pending.subarray(8 + hl);
      pending = Buffer.alloc(0);
      authed = true;
      if (h?.type === "auth_ok") {
        if (rest.length) this.stdout.write(rest);
        return;
      }
      if (h?.type === "error" && h.id === null && /^(unauthorized|busy)$/.test(h.error?.code))
        this.configError = { code: h.error.code, message: String(h.error.message) };
      // The error frame goes on to the client, which keeps it as the reason it could not start.
      this.stdout.write(frame);
      if (rest.length) this.stdout.write(rest);
    });
    socket.on("close", () => {
      if (this.exited) return;
      if (this.configError) {
        const busy = this.configError.code === "busy";
        this.onRefused({
          worker: this.ep.name,
          address: this.ep.connect,
          reason: busy ? "busy" : "unauthorized",
          message: this.configError.message,
        });
        // busy is temporary: exit like a crash so the supervisor retries with backoff.
        return this.exit(busy ? 1 : 2, null);
      }
      if (connected && !answered) {
        // The worker always answers an auth frame once TLS is up; closing without a word means
        // its TLS layer refused us: our client certificate is not signed by its --client-ca.
        return this.refuse(
          "tls",
          `the worker at ${this.ep.connect} closed the connection without answering: it most likely rejected our client certificate; use one signed by its --client-ca`,
        );
      }
      this.exit(connected ? 0 : 1, null);
    });
  }

  private refuse(reason: RemoteRefusal["reason"], message: string): void {
    this.onRefused({ worker: this.ep.name, address: this.ep.connect, reason, message });
    this.stdout.write(
      Buffer.concat(
        encodeFrame({
          type: "error",
          id: null,
          error: { code: "worker_unavailable", message, recoverable: false },
        }),
      ),
    );
    this.socket?.destroy();
    this.exit(2, null);
  }

  private exit(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exited) return;
    this.exited = true;
    this.exitCode = code;
    this.stdout.end();
    this.emit("exit", code, signal);
    this.emit("close", code, signal);
  }

  kill(signal: NodeJS.Signals | number = "SIGTERM"): boolean {
    if (this.exited) return false;
    this.socket?.destroy();
    this.exit(null, typeof signal === "string" ? signal : "SIGKILL");
    return true;
  }
}

/** A SpawnFn for WorkerRuntime that connects to a remote worker instead of spawning one. */
export function remoteSpawn(
  ep: RemoteEndpoint,
  onRefused: (r: RemoteRefusal) => void = () => {},
): SpawnFn {
  splitHostPort(ep.connect); // fail at configuration time, not at the first call
  return (() => new SocketChild(ep, onRefused)) as unknown as SpawnFn;
}

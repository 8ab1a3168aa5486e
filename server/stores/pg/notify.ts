// Changes made by other replicas, as they commit: Postgres LISTEN/NOTIFY on one dedicated client
// taken from the pool (a LISTEN belongs to a connection, so it cannot share the pool's). A store
// sends its notification in the transaction of its write (pg_notify is delivered on COMMIT, never
// for a rollback), tagged with the sending process's origin so it does not hear itself twice.
// A dropped connection is taken again after a back-off; what was sent meanwhile is not replayed,
// so a listener that must not miss anything also polls (server/app/approval_feed.ts does).
import { randomBytes } from "node:crypto";
import type { PgClient, PgPool } from "./pool.js";

export interface Notification {
  /** The process that sent it. */
  origin: string;
  /** What happened ("created", "decided"...), the sender's words. */
  type: string;
  /** Which row. */
  id: string;
}

type Handler = (n: Notification) => void;

/** A process's identity in notifications: random, so two replicas never share one. */
export const newOrigin = () => randomBytes(8).toString("hex");

/** The SQL that sends a notification on `channel` (parameters: origin, type, id). */
export const notifySql = (channel: string, origin: string, type: string, id: string) => ({
  text: "SELECT pg_notify($1, $2)",
  values: [channel, JSON.stringify({ origin, type, id })],
});

export class PgListener {
  private client: PgClient | undefined;
  private connecting: Promise<void> | undefined;
  private readonly handlers = new Set<Handler>();
  private retry: ReturnType<typeof setTimeout> | undefined;
  private closed = false;

  constructor(
    private readonly pool: PgPool,
    private readonly channel: string,
    private readonly opts: {
      onError?: (e: unknown) => void;
      /** After each LISTEN took effect, the first and every one after a lost connection. */
      onListening?: () => void;
      retryMs?: number;
    } = {},
  ) {
    // The channel is an identifier in LISTEN, not a parameter: only plain names are accepted.
    if (!/^[a-z_][a-z0-9_]*$/.test(channel)) throw new Error(`bad channel name ${channel}`);
  }

  /** Calls `fn` for every notification on the channel from now on; returns the unsubscribe. */
  on(fn: Handler): () => void {
    this.handlers.add(fn);
    // Not reachable now: try again after the back-off (the database may be starting).
    this.ready().catch((e) => {
      this.opts.onError?.(e);
      this.again();
    });
    return () => {
      this.handlers.delete(fn);
    };
  }

  /** Resolves once LISTEN is in force (a notification committed after this is heard). */
  ready(): Promise<void> {
    if (this.client) return Promise.resolve();
    this.connecting ??= this.connect().finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    const c = await this.pool.connect();
    try {
      c.on("notification", (m) => {
        if (m.channel !== this.channel || !m.payload) return;
        let n: Notification;
        try {
          n = JSON.parse(m.payload) as Notification;
        } catch {
          return;
        }
        for (const h of this.handlers) {
          try {
            h(n);
          } catch (e) {
            this.opts.onError?.(e);
          }
        }
      });
      c.on("error", (e) => this.lost(c, e));
      c.on("end", () => this.lost(c, new Error("the LISTEN connection ended")));
      await c.query(`LISTEN ${this.channel}`);
    } catch (e) {
      c.release(true);
      throw e;
    }
    if (this.closed) {
      c.release(true);
      return;
    }
    this.client = c;
    this.opts.onListening?.();
  }

  /** The connection broke: drop it and listen again after a while. */
  private lost(c: PgClient, e: unknown): void {
    this.opts.onError?.(e);
    if (this.client !== c) return;
    this.client = undefined;
    c.release(true);
    this.again();
  }

  /** Listens again after the back-off, and again after that while the database is away. */
  private again(): void {
    if (this.closed || this.retry) return;
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.ready().catch((err) => {
        this.opts.onError?.(err);
        this.again();
      });
    }, this.opts.retryMs ?? 1000);
    this.retry.unref();
  }

  /** Stops listening and gives the connection back (destroyed: it holds a LISTEN). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.retry) clearTimeout(this.retry);
    await this.connecting?.catch(() => {});
    const c = this.client;
    this.client = undefined;
    this.handlers.clear();
    if (c) {
      await c.query(`UNLISTEN ${this.channel}`).catch(() => {});
      c.release(true);
    }
  }
}

// The approval feed announces each change once, whether it happened in this process (store
// hook) or in another one on the same SQLite file (the CLI), and notices expiry.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { ApprovalFeed, type FeedEvent } from "../../server/app/approval_feed.js";

const stores: SqliteApprovalQueue[] = [];
const feeds: ApprovalFeed[] = [];
afterEach(() => {
  feeds.splice(0).forEach((f) => f.close());
  stores.splice(0).forEach((s) => s.close());
});

function setup() {
  const file = join(mkdtempSync(join(tmpdir(), "tpu-mcp-feed-")), "policy.db");
  const server = new SqliteApprovalQueue(file);
  const cli = new SqliteApprovalQueue(file); // another process, as far as the feed can tell
  stores.push(server, cli);
  const feed = new ApprovalFeed(server, { pollMs: 60_000 });
  feeds.push(feed);
  const seen: string[] = [];
  feed.on((e: FeedEvent) => seen.push(`${e.type}:${e.record.status}`));
  return { server, cli, feed, seen };
}

const req = (ttl_s = 900) => ({
  principal: "agent",
  tool: "run_benchmark",
  args_digest: "a".repeat(64),
  args_preview: { model: "m" },
  ttl_s,
});

describe("ApprovalFeed", () => {
  it("announces in-process changes at once and not again on the next poll", async () => {
    const { server, feed, seen } = setup();
    const a = await server.create(req());
    await server.approve(a.id, "operator");
    await server.consume(a.id, "agent", "run_benchmark", "a".repeat(64));
    await feed.poll();
    expect(seen).toEqual(["created:pending", "decided:approved", "used:used"]);
  });

  it("finds changes made by another process when it polls, in order", async () => {
    const { cli, feed, seen } = setup();
    const a = await cli.create(req());
    const b = await cli.create(req());
    await cli.deny(b.id, "operator", "no");
    expect(seen).toEqual([]);
    await feed.poll();
    expect(seen).toEqual(["created:pending", "created:denied", "decided:denied"]);
    await cli.approve(a.id, "operator");
    await feed.poll();
    await feed.poll();
    expect(seen.slice(3)).toEqual(["decided:approved"]);
  });

  it("announces expiry once the deadline passes", async () => {
    const { server, feed, seen } = setup();
    await server.create(req(0.05));
    await new Promise((r) => setTimeout(r, 120));
    await feed.poll();
    expect(seen).toEqual(["created:pending", "expired:expired"]);
  });
});

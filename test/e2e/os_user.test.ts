// The server as its own OS user (issue 21, item 5; examples/deploy/tpu-mcp.service): its data dir
// is private (0700), and a process of another user — where an agent with a shell runs — can
// neither read a token there, nor write the approvals database, nor approve with the CLI. The
// same CLI run as the server's user can (so the refusals are the separation, not a broken set-up).
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  cliAs,
  deployFor,
  ensureUser,
  nodeAs,
  osUsersUnavailable,
  runAs,
  spawnAs,
  type OsUser,
} from "../helpers/os_user.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import { connectHttp, errorOf, startHttpServer, type HttpServerProc } from "../helpers/server.js";
import { call } from "./scenario.js";

const unavailable = osUsersUnavailable();
const title = `the server as its own OS user${unavailable ? ` (skipped: ${unavailable})` : ""}`;
// One line on the terminal: a skipped suite is otherwise easy to miss.
if (unavailable) process.stderr.write(`os_user.test.ts: skipped: ${unavailable}\n`);

describe.skipIf(unavailable !== null)(title, () => {
  let server: OsUser;
  let attacker: OsUser;
  let srv: HttpServerProc;
  let base: string;
  let state: string;
  let config: string;
  let approvalId: string;

  beforeAll(async () => {
    server = ensureUser("tpumcp-test-srv");
    attacker = ensureUser("tpumcp-test-agent");
    ({
      dir: base,
      state,
      config,
    } = deployFor(server, "tpu-mcp-osuser-", {
      log_level: "warn",
      // No worker needed to show the boundary (the Python of this machine may not be reachable
      // by other users); the rule gates a call that never reaches one.
      runtime: { start: "lazy", device: "cpu" },
      // elicitation left on (the default): the rule's token assurance alone keeps the agent's
      // own client from being asked.
      policy: { approvals: { rules: [{ tool: "unload_model" }] } },
    }));
    srv = await startHttpServer(config, [], spawnAs(server, state));
    const agent = await connectHttp(srv.url, srv.token);
    try {
      const r = await call(agent.client, "unload_model", { model: "mnist-cnn" });
      expect(errorOf(r)?.code).toBe("approval_required");
      approvalId = errorOf(r)!.details.approval_id;
    } finally {
      await agent.close();
    }
  });
  afterAll(async () => {
    await srv?.stop();
    if (base) rmSync(base, { recursive: true, force: true });
  });

  const statusAsServer = async () => {
    const r = await cliAs(server, config, ["approvals", "show", approvalId, "--json"], {
      home: state,
    });
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout).status as string;
  };

  it("keeps the data dir private to the server's user", () => {
    const st = statSync(state);
    expect(st.mode & 0o777).toBe(0o700);
    expect(st.uid).toBe(server.uid);
    for (const f of ["operator-token", "local-token", "policy.db", "audit.key"]) {
      const s = statSync(join(state, f));
      expect(s.uid, f).toBe(server.uid);
      expect(s.mode & 0o077, f).toBe(0);
    }
  });

  it("refuses another user's reads of the token files", async () => {
    for (const f of ["operator-token", "local-token"]) {
      const r = await runAs(attacker, "cat", [join(state, f)]);
      expect(r.code, f).not.toBe(0);
      expect(r.stderr).toMatch(/Permission denied/);
      expect(r.stdout).toBe("");
    }
  });

  it("refuses another user's writes to the approvals database", async () => {
    const db = join(state, "policy.db");
    const attempts = await nodeAs(
      attacker,
      `const fs = require("node:fs");
       const out = {};
       const tryIt = (name, fn) => { try { fn(); out[name] = "DONE"; } catch (e) { out[name] = e.code ?? String(e); } };
       tryIt("open_rw", () => fs.closeSync(fs.openSync(${JSON.stringify(db)}, "r+")));
       tryIt("sqlite_update", () => {
         const Database = require("better-sqlite3");
         new Database(${JSON.stringify(db)}).prepare("UPDATE approvals SET status = 'approved'").run();
       });
       tryIt("replace", () => fs.writeFileSync(${JSON.stringify(join(state, "policy.db.new"))}, "x"));
       console.log(JSON.stringify(out));`,
    );
    expect(attempts.code, attempts.stderr).toBe(0);
    const out = JSON.parse(attempts.stdout);
    expect(out.open_rw).toBe("EACCES");
    expect(out.sqlite_update).not.toBe("DONE");
    expect(out.replace).toBe("EACCES");
    expect(await statusAsServer()).toBe("pending");
  });

  it("refuses another user's approval with the CLI, with or without the agent's token", async () => {
    const plain = await cliAs(attacker, config, ["approvals", "approve", approvalId]);
    expect(plain.code).not.toBe(0);
    expect(plain.stderr).toMatch(/EACCES|permission denied/i);
    const withToken = await cliAs(attacker, config, [
      "approvals",
      "approve",
      approvalId,
      "--token",
      srv.token!,
    ]);
    expect(withToken.code).not.toBe(0);
    // Nor can it read the pending requests.
    const list = await cliAs(attacker, config, ["approvals", "list"]);
    expect(list.stdout).not.toContain(approvalId);
    expect(await statusAsServer()).toBe("pending");
  });

  it("does not let the agent approve by answering its own client's form, in either era (issue 33)", async () => {
    // The agent holds nothing but its token; its clients say yes to any form they are shown.
    const legacy = await connectHttp(srv.url, srv.token, {
      capabilities: { elicitation: { form: {} } },
    });
    let asked = 0;
    legacy.client.setRequestHandler(ElicitRequestSchema, async () => {
      asked++;
      return { action: "accept", content: { approve: true } };
    });
    const modern = await connectModernHttp(srv.url, srv.token, {
      client: { capabilities: { elicitation: { form: {} } } } as any,
    });
    modern.client.setRequestHandler("elicitation/create", async () => {
      asked++;
      return { action: "accept", content: { approve: true } } as any;
    });
    try {
      const a = errorOf(await call(legacy.client, "unload_model", { model: "mnist-cnn" }));
      const b = errorOf(await callModern(modern.client, "unload_model", { model: "mnist-cnn" }));
      for (const e of [a, b]) {
        expect(e?.code).toBe("approval_required");
        expect(e?.details.approval_id).toBe(approvalId);
      }
      expect(asked).toBe(0);
      expect(await statusAsServer()).toBe("pending");
    } finally {
      await legacy.close();
      await modern.close();
    }
  });

  it("lets the server's own user approve (the boundary is the user, not a broken set-up)", async () => {
    const r = await cliAs(server, config, ["approvals", "approve", approvalId], { home: state });
    expect(r.code, r.stderr).toBe(0);
    expect(await statusAsServer()).toBe("approved");
  });
});

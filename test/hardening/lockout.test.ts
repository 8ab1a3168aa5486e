// One token-less process must not lock everyone out (issue 33): on one machine every client is
// 127.0.0.1, so the failed-auth limiter's back-off of an address is also the back-off of every
// valid client there. A separate process guesses bearer tokens and console sign-ins as fast as
// it can, from 127.0.0.1, for the whole test; meanwhile a real MCP client of each era keeps
// calling with the agent's valid token, and the operator signs in to the console and uses the
// session. Each valid request must be answered; the guesser is still throttled (429).
import { spawn, type ChildProcess } from "node:child_process";
import { connect } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import { connectHttp, type HttpServerProc } from "../helpers/server.js";
import { cleanupTemp, ROOT, startLazyDemoServer, TOKENS } from "./helpers.js";

const CALLS = 20;

describe("a token-less guesser on 127.0.0.1 does not lock out valid credentials", () => {
  let server: HttpServerProc;
  let guesser: ChildProcess;
  let guesses = "";

  beforeAll(async () => {
    ({ server } = await startLazyDemoServer());
    const base = server.url.replace(/\/mcp$/, "");
    guesser = spawn(
      process.execPath,
      [join(ROOT, "test/helpers/token_guesser.mjs"), JSON.stringify({ base })],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    guesser.stdout!.on("data", (d) => (guesses += d));
    // The address is in back-off once a wrong token of ours is refused unevaluated.
    for (;;) {
      const r = await fetch(server.url, {
        method: "POST",
        headers: { authorization: "Bearer probe-wrong", "content-type": "application/json" },
        body: "{}",
      });
      await r.body?.cancel();
      if (r.status === 429) break;
    }
  });
  afterAll(async () => {
    if (guesser && guesser.exitCode === null) guesser.kill("SIGKILL");
    await server?.stop();
    cleanupTemp();
  });

  it("answers every call of a 2025-era client with a valid token", async () => {
    const agent = await connectHttp(server.url, TOKENS.agent);
    try {
      for (let i = 0; i < CALLS; i++) {
        const r: any = await agent.client.callTool({ name: "list_models", arguments: {} });
        expect(r.isError, JSON.stringify(r).slice(0, 300)).toBeFalsy();
      }
    } finally {
      await agent.close();
    }
  });

  it("answers every call of a 2026-07-28 client (no session: each request carries the token)", async () => {
    const agent = await connectModernHttp(server.url, TOKENS.agent);
    try {
      for (let i = 0; i < CALLS; i++) {
        const r = await callModern(agent.client, "list_models", {});
        expect(r.isError, JSON.stringify(r).slice(0, 300)).toBeFalsy();
      }
    } finally {
      await agent.close();
    }
  });

  it("signs the operator in to the console every time, and the session works", async () => {
    const base = server.url.replace(/\/mcp$/, "");
    for (let i = 0; i < 5; i++) {
      const r = await fetch(`${base}/console/api/session`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token: TOKENS.operator }),
      });
      expect(r.status, await r.clone().text()).toBe(200);
      const cookie = (r.headers.get("set-cookie") ?? "").split(";")[0];
      const list = await fetch(`${base}/console/api/approvals`, { headers: { cookie } });
      expect(list.status).toBe(200);
    }
  });

  it("cuts off sign-ins whose body never comes; the operator signs in meanwhile", async () => {
    const u = new URL(server.url);
    const sockets = Array.from({ length: 5 }, () => {
      const s = connect({ host: u.hostname, port: Number(u.port) });
      s.on("error", () => {});
      s.write(
        `POST /console/api/session HTTP/1.1\r\nHost: ${u.host}\r\nContent-Type: application/json\r\n` +
          "Content-Length: 100\r\n\r\n",
      );
      return new Promise<void>((closed) => s.once("close", () => closed()));
    });
    const r = await fetch(`${u.origin}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: TOKENS.operator }),
    });
    expect(r.status).toBe(200);
    // The server closes each of them (after its 10 s for the body); none is left open.
    await Promise.all(sockets);
  });

  it("still throttles the guesser: most of its guesses were refused unevaluated", async () => {
    const done = new Promise((r) => guesser.once("exit", r));
    guesser.kill("SIGTERM");
    await done;
    const counts = JSON.parse(guesses.trim());
    for (const surface of ["mcp", "console"]) {
      const c = counts[surface];
      const refused = c["429"] ?? 0;
      const evaluated = c["401"] ?? 0;
      expect(refused, JSON.stringify(counts)).toBeGreaterThan(evaluated);
    }
  });
});

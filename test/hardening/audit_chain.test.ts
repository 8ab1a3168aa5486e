// The audit trail against someone who can write the database but not read the key: a real server
// writes the trail, `tpu-mcp audit head` exports its head, and the CLI's `audit verify` must
// catch a database rolled back to an earlier (internally consistent) copy and a wiped trail.
import { copyFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { connectHttp, startHttpServer } from "../helpers/server.js";
import { baseConfig, cleanupTemp, cli, DEMO_POLICY, tempDir, TOKENS } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const T = { timeout: scaled(300_000) };
afterAll(() => cleanupTemp());

describe("keyed audit trail, exported head", () => {
  it(
    "verifies a live trail, then catches a rollback to an old copy and a wiped trail",
    T,
    async () => {
      const dir = tempDir();
      const data = join(dir, "data");
      const cfg = join(dir, "config.json");
      writeFileSync(
        cfg,
        JSON.stringify(
          baseConfig(dir, {
            policy: {
              ...DEMO_POLICY,
              limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 10_000 } },
            },
            runtime: { start: "lazy" },
          }),
        ),
      );
      const server = await startHttpServer(cfg);
      // Each refusal a different call (a repeated one is only counted until its window ends),
      // so each appends a record at once.
      let calls = 0;
      const denied = async (n: number) => {
        const reader = await connectHttp(server.url, TOKENS.reader);
        for (let i = 0; i < n; i++)
          await reader.client
            .callTool({ name: "check_model", arguments: { model: `nope-${calls++}` } })
            .catch(() => {});
        await reader.close();
      };
      try {
        await denied(3);
        // The key was made at first start, 0600, beside (not inside) the database.
        expect(statSync(join(data, "audit.key")).mode & 0o777).toBe(0o600);
        const v1 = await cli(cfg, "audit", "verify");
        expect(v1.code, v1.stdout + v1.stderr).toBe(0);

        // A consistent copy of the database as it is now (what a backup or an attacker keeps).
        const old = join(dir, "policy-old.db");
        const live = new Database(join(data, "policy.db"));
        await live.backup(old);
        live.close();

        await denied(3);
        const head = await cli(cfg, "audit", "head");
        expect(head.code, head.stderr).toBe(0);
        const exported = JSON.parse(head.stdout);
        expect(exported).toMatchObject({ seq: expect.any(Number), hash: expect.any(String) });
        expect(exported.key_id).toMatch(/^[0-9a-f]{16}$/);
        const headFile = join(dir, "head.json");
        writeFileSync(headFile, head.stdout);
        const v2 = await cli(cfg, "audit", "verify", "--head", headFile);
        expect(v2.code, v2.stdout + v2.stderr).toBe(0);
        expect(v2.stdout).toMatch(/include the exported head/);
      } finally {
        await server.stop();
      }

      // Rolled back to the old copy: consistent on its own, but it lacks the exported head.
      for (const f of ["policy.db-wal", "policy.db-shm"]) rmSync(join(data, f), { force: true });
      copyFileSync(join(dir, "policy-old.db"), join(data, "policy.db"));
      const alone = await cli(cfg, "audit", "verify");
      expect(alone.code, alone.stdout).toBe(0);
      const rolled = await cli(cfg, "audit", "verify", "--head", join(dir, "head.json"));
      expect(rolled.code).toBe(1);
      expect(rolled.stdout).toMatch(/TAMPERED .*exported head is record \d+, but the trail ends/);

      // Every row wiped, the head row too: the key says a trail existed.
      const db = new Database(join(data, "policy.db"));
      db.exec("DELETE FROM audit_log; DELETE FROM audit_head;");
      db.close();
      const wiped = await cli(cfg, "audit", "verify");
      expect(wiped.code).toBe(1);
      expect(wiped.stdout).toMatch(/TAMPERED .*trail is empty, but the key/);
    },
  );
});

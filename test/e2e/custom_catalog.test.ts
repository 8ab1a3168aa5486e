// A catalog of one's own replaces the built-in one (docs/configuration.md, "A catalog of your
// own"): the server says so at start, naming what it serves, instead of a built-in model going
// missing silently. A real server; the worker starts lazily (none is needed to list the catalog).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ROOT, connectHttp, startHttpServer, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

describe("a catalog of one's own", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-catalog-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it(
    "is said at start to replace the built-in one, with the models it serves",
    { timeout: scaled(120_000) },
    async () => {
      const builtin = JSON.parse(readFileSync(join(ROOT, "runtime/catalog.builtin.json"), "utf8"));
      const catalog = join(dir, "my-catalog.json");
      writeFileSync(
        catalog,
        JSON.stringify({
          model_roots: [join(ROOT, ".data", "models")],
          models: builtin.models.filter((m: { id: string }) => m.id === "mnist-cnn"),
        }),
      );
      const config = writeConfig(
        {
          runtime: {
            start: "lazy",
            device: "cpu",
            catalog,
            python: join(ROOT, ".venv/bin/python"),
          },
        },
        dir,
      );
      const server = await startHttpServer(config);
      try {
        expect(server.stderr()).toMatch(
          /my-catalog\.json replaces the built-in one: only its 1 model\(s\) are served \(mnist-cnn\)/,
        );
        const agent = await connectHttp(server.url, server.token);
        try {
          const listed = await call(agent.client, "list_models", {});
          expect(listed.structuredContent.models.map((m: { id: string }) => m.id)).toEqual([
            "mnist-cnn",
          ]);
        } finally {
          await agent.close();
        }
      } finally {
        await server.stop();
      }
    },
  );
});

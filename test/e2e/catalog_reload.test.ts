// A model added to the catalog file of a running server is served after SIGHUP (README: Config
// reload): the running worker adds it, list_models lists it, load_model's schema accepts it and
// the load runs, in a session opened before the reload (told by tools/list_changed) and in a new
// one. A real server over
// HTTP with its worker started before the change, and a real MCP client.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { ROOT, connectHttp, errorOf, startHttpServer, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

const builtin = JSON.parse(readFileSync(join(ROOT, "runtime/catalog.builtin.json"), "utf8"));
const entry = (id: string) => builtin.models.find((m: { id: string }) => m.id === id);
const ids = (r: any) => r.structuredContent.models.map((m: { id: string }) => m.id);

async function until(what: string, ok: () => boolean, log: () => string) {
  const end = Date.now() + scaled(30_000);
  while (!ok()) {
    if (Date.now() > end) throw new Error(`no ${what} in time:\n${log()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("SIGHUP with models added to the catalog", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-catalog-reload-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it(
    "serves the new model at once: listed, accepted and loaded by the running worker",
    { timeout: scaled(240_000) },
    async () => {
      const catalog = join(dir, "catalog.json");
      const write = (models: string[]) =>
        writeFileSync(
          catalog,
          JSON.stringify({
            model_roots: [join(ROOT, ".data", "models")],
            models: models.map(entry),
          }),
        );
      write(["mnist-cnn"]);
      const config = writeConfig(
        {
          log_level: "info",
          runtime: { device: "cpu", catalog, python: join(ROOT, ".venv/bin/python") },
        },
        dir,
      );
      const server = await startHttpServer(config);
      const agent = await connectHttp(server.url, server.token);
      let listChanged = 0;
      agent.client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
        listChanged++;
      });
      try {
        // The worker is running and has read the catalog as it was.
        const loaded = await call(agent.client, "load_model", { model: "mnist-cnn" });
        expect(errorOf(loaded), JSON.stringify(loaded)).toBeUndefined();
        expect(ids(await call(agent.client, "list_models", {}))).toEqual(["mnist-cnn"]);

        write(["mnist-cnn", "tiny-gpt2"]);
        const before = server.stderr().length;
        server.proc.kill("SIGHUP");
        const since = () => server.stderr().slice(before);
        await until("reload", () => /config reload/.test(since()), since);
        expect(since()).toMatch(/config reloaded: applied catalog: added tiny-gpt2/);

        // The session opened before the reload: told its tools changed, and served the model.
        await until("tools/list_changed", () => listChanged === 1, since);
        expect(ids(await call(agent.client, "list_models", {}))).toEqual([
          "mnist-cnn",
          "tiny-gpt2",
        ]);
        const load = await call(agent.client, "load_model", { model: "tiny-gpt2" });
        expect(errorOf(load), JSON.stringify(load)).toBeUndefined();
        expect(load.structuredContent.model).toBe("tiny-gpt2");

        // A new session: its load_model schema names the model.
        const fresh = await connectHttp(server.url, server.token);
        try {
          const { tools } = await fresh.client.listTools();
          const schema = tools.find((t) => t.name === "load_model")!.inputSchema as any;
          expect(schema.properties.model.enum).toContain("tiny-gpt2");
        } finally {
          await fresh.close();
        }

        // Nothing new: a second SIGHUP says so.
        const again = server.stderr().length;
        server.proc.kill("SIGHUP");
        await until("reload", () => /config reload/.test(server.stderr().slice(again)), since);
        expect(server.stderr().slice(again)).toMatch(/config reloaded: no change/);
        expect(listChanged).toBe(1);
      } finally {
        await agent.close();
        await server.stop();
      }
    },
  );
});

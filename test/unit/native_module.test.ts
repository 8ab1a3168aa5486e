// The native SQLite module failing to load (server/app/native_module.ts): the real errors Node and
// better-sqlite3 throw for a missing and for a broken .node file are recognised and told with the
// reason, npm's log and the ways out; a stdio server that cannot start answers MCP with it.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import {
  isNativeLoadError,
  nativeModuleHelp,
  probeSqlite,
} from "../../server/app/native_module.js";
import { answerWithReason } from "../../server/transports/failed_start.js";
import { CLI, ROOT } from "../helpers/server.js";

const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-native-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** What `fn` throws. */
function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (e) {
    return e;
  }
  throw new Error("expected a throw");
}

describe("the native module's failure", () => {
  it("a missing .node file (require's own error): the reason, npm's log and the ways out", () => {
    const missing = join(scratch, "build", "Release", "better_sqlite3.node");
    const e = thrown(() => createRequire(import.meta.url)(missing));
    expect(isNativeLoadError(e)).toBe(true);
    const help = nativeModuleHelp(e, { npm_config_cache: "/home/ann/.npm" });
    expect(help).toContain(`better-sqlite3): Cannot find module '${missing}'`);
    expect(help).toContain("/home/ann/.npm/_logs");
    expect(help).toMatch(/prebuilt binary: use a Node LTS release/);
    expect(help).toMatch(/build-essential python3; macOS: xcode-select --install/);
    expect(help).toContain("npx -y tpu-mcp --version");
    expect(help).toContain("docs/troubleshooting.md");
    expect(help).not.toMatch(/\n\s+at /); // one reason line, no stack
    // Without npm's variable: the default cache under HOME.
    expect(nativeModuleHelp(e, { HOME: "/home/bob" })).toContain("/home/bob/.npm/_logs");
  });

  it("better-sqlite3 given a missing or a broken binary: recognised the same", () => {
    const missing = probeSqlite(join(scratch, "nowhere.node"));
    expect(isNativeLoadError(missing)).toBe(true);
    const broken = join(scratch, "broken.node");
    writeFileSync(broken, "not a shared object");
    const e = probeSqlite(broken);
    expect((e as NodeJS.ErrnoException).code).toBe("ERR_DLOPEN_FAILED");
    expect(isNativeLoadError(e)).toBe(true);
    expect(nativeModuleHelp(e)).toContain(broken);
  });

  it("the installed module loads; a database file's own error is not a load failure", () => {
    expect(probeSqlite()).toBeNull();
    const e = thrown(() => new Database(join(scratch, "no", "such", "dir", "x.db")));
    expect(isNativeLoadError(e)).toBe(false);
  });

  it("says when the binary was built for another Node", () => {
    const e = Object.assign(
      new Error(
        "The module was compiled against a different Node.js version using NODE_MODULE_VERSION 115.",
      ),
      { code: "ERR_DLOPEN_FAILED" },
    );
    expect(nativeModuleHelp(e, { npm_config_cache: "/c" })).toMatch(
      /built for another Node version.*rm -rf \/c\/_npx/,
    );
  });
});

describe("a stdio server that cannot start", () => {
  it("answers each request with the reason and ends with stdin", async () => {
    const input = new PassThrough();
    const output = new PassThrough();
    let written = "";
    output.on("data", (d) => (written += d));
    const done = answerWithReason("tpu-mcp cannot load its native SQLite module", input, output);
    input.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: {} }) + "\n");
    input.write(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) + "\n");
    input.end(JSON.stringify({ jsonrpc: "2.0", id: "b", method: "tools/list" }) + "\n");
    await done;
    expect(
      written
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l)),
    ).toEqual([
      {
        jsonrpc: "2.0",
        id: 1,
        error: { code: -32603, message: "tpu-mcp cannot load its native SQLite module" },
      },
      {
        jsonrpc: "2.0",
        id: "b",
        error: { code: -32603, message: "tpu-mcp cannot load its native SQLite module" },
      },
    ]);
  });
});

describe("tpu-mcp --version", () => {
  it("prints the package's version, as -v too", async () => {
    const version = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).version;
    for (const flag of ["--version", "-v"]) {
      const r = await promisify(execFile)(process.execPath, [CLI, flag], { cwd: scratch });
      expect(r.stdout, flag).toBe(`${version}\n`);
    }
  });
});

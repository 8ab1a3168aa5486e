// The install layout (server/config/install_layout.ts): a checkout keeps today's paths exactly;
// an installed package keeps its code in the package and the venv, models and data per user.
import { mkdtempSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { execFileSync, spawnSync } from "node:child_process";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadConfig, parseConfig } from "../../server/config/config.js";
import { installKind, installLayout, userHome } from "../../server/config/install_layout.js";
import { writeUserCatalog } from "../../server/setup/user_catalog.js";

const REPO = resolve(import.meta.dirname, "..", "..");
const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-layout-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** `git args…` in `cwd`: its exit status (check-ignore: 0 ignored, 1 not). */
function git(cwd: string, ...args: string[]): number | null {
  return spawnSync("git", args, { cwd, stdio: "ignore" }).status;
}

/** A folder shaped like the installed package: the shipped files, no TypeScript sources. */
function fakePackage(): string {
  const root = mkdtempSync(join(scratch, "pkg-"));
  mkdirSync(join(root, "runtime", "worker"), { recursive: true });
  writeFileSync(
    join(root, "runtime", "catalog.builtin.json"),
    readFileSync(join(REPO, "runtime", "catalog.builtin.json")),
  );
  return root;
}

describe("install layout", () => {
  it("a checkout: every path is where it always was", () => {
    const l = installLayout(REPO, { env: { HOME: "/nowhere", XDG_DATA_HOME: "/xdg" } });
    expect(l.kind).toBe("clone");
    expect(l.home).toBeNull();
    expect(l.workerDir).toBe(join(REPO, "runtime", "worker"));
    expect(l.python).toBe(join(REPO, ".venv", "bin", "python"));
    expect(l.catalog).toBe(join(REPO, "runtime", "catalog.builtin.json"));
    expect(l.models).toBe(join(REPO, ".data", "models"));
    expect(l.consoleAssets).toBe(join(REPO, "dist", "console"));
    // The config a newcomer runs on: the same paths as before the layout existed.
    const c = loadConfig(undefined, REPO, {}, l);
    expect(c.paths.python).toBe(join(REPO, ".venv", "bin", "python"));
    expect(c.paths.data_dir).toBe(join(REPO, ".data"));
    expect(c.paths.catalog).toBe(join(REPO, "runtime", "catalog.builtin.json"));
  });

  it("a checkout's venv, packages and data are ignored by git, as folders and as links to them", () => {
    // A git worktree links these to the main checkout's folders; git sees a link as a file, which
    // a pattern with a trailing slash does not match (.data once got committed that way).
    const tree = mkdtempSync(join(scratch, "tree-"));
    execFileSync("git", ["init", "-q"], { cwd: tree });
    writeFileSync(join(tree, ".gitignore"), readFileSync(join(REPO, ".gitignore")));
    const target = mkdtempSync(join(scratch, "target-"));
    for (const name of ["node_modules", ".venv", ".data"]) {
      symlinkSync(target, join(tree, name));
      expect(git(tree, "check-ignore", name), name).toBe(0);
    }
    expect(git(tree, "check-ignore", ".gitignore")).toBe(1); // the check itself can say no
  });

  it("a package: code in the package, venv, models and data in the XDG data dir", () => {
    const root = fakePackage();
    expect(installKind(root)).toBe("package");
    const l = installLayout(root, { env: { HOME: "/home/u", XDG_DATA_HOME: "/xdg" } });
    expect(l.kind).toBe("package");
    expect(l.home).toBe("/xdg/tpu-mcp");
    expect(l.workerDir).toBe(join(root, "runtime", "worker"));
    expect(l.python).toBe("/xdg/tpu-mcp/venv/bin/python");
    expect(l.models).toBe("/xdg/tpu-mcp/models");
    expect(l.dataDir).toBe("/xdg/tpu-mcp/data");
    const c = parseConfig({}, { root, layout: l });
    expect(c.paths.data_dir).toBe("/xdg/tpu-mcp/data");
    expect(c.paths.python).toBe("/xdg/tpu-mcp/venv/bin/python");
    expect(c.paths.catalog).toBe("/xdg/tpu-mcp/catalog.builtin.json");
    expect(c.runtime.engines.vllm?.python ?? l.vllmPython).toBe(l.vllmPython);
  });

  it("the per-user folder: --home over TPU_MCP_HOME over XDG_DATA_HOME over ~/.local/share", () => {
    const env = { HOME: "/home/u", XDG_DATA_HOME: "/xdg", TPU_MCP_HOME: "/opt/t" };
    expect(userHome({ env, home: "/flag" })).toBe("/flag");
    expect(userHome({ env })).toBe("/opt/t");
    expect(userHome({ env: { HOME: "/home/u", XDG_DATA_HOME: "/xdg" } })).toBe("/xdg/tpu-mcp");
    // XDG: a relative XDG_DATA_HOME is ignored.
    expect(userHome({ env: { HOME: "/home/u", XDG_DATA_HOME: "rel" } })).toBe(
      "/home/u/.local/share/tpu-mcp",
    );
    const venv = installLayout(fakePackage(), { env: { HOME: "/h", TPU_MCP_VENV: "/v" } });
    expect(venv.python).toBe("/v/bin/python");
    expect(venv.models).toBe("/h/.local/share/tpu-mcp/models");
  });

  it("TPU_MCP_LAYOUT forces a kind", () => {
    expect(installKind(REPO, { TPU_MCP_LAYOUT: "package" })).toBe("package");
    expect(installKind(fakePackage(), { TPU_MCP_LAYOUT: "clone" })).toBe("clone");
  });

  it("a package's catalog is the shipped one with its model roots in the per-user folder", () => {
    const root = fakePackage();
    const home = join(scratch, "home-cat");
    const l = installLayout(root, { env: { TPU_MCP_HOME: home } });
    writeUserCatalog(l);
    const cat = JSON.parse(readFileSync(l.catalog, "utf8"));
    const shipped = JSON.parse(readFileSync(l.shippedCatalog, "utf8"));
    expect(cat.model_roots).toEqual([join(home, "models")]);
    // The shipped datasets are read where the package keeps them.
    expect(cat.dataset_roots).toEqual([join(root, "runtime", "datasets")]);
    expect(cat.models).toEqual(shipped.models);
  });
});

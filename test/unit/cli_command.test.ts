// The operator's command line (server/config/cli_command.ts) for each install: a clone's bin by
// absolute path, a package npx runs as `npx -y tpu-mcp`, --home and --config only when a bare
// command would not find the same data.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { cliCommand, cliProgram, consoleStart } from "../../server/config/cli_command.js";
import { installLayout, layoutOf } from "../../server/config/install_layout.js";

const REPO = resolve(import.meta.dirname, "..", "..");
const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-clicmd-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** A folder shaped like the installed package (no TypeScript sources) at `rel` under scratch. */
function packageAt(rel: string): string {
  const root = join(scratch, rel);
  mkdirSync(join(root, "runtime", "worker"), { recursive: true });
  return root;
}

const HOME = "/home/ann";
const approve = ["approvals", "approve", "apr_0123"];

describe("the operator's command", () => {
  it("a clone: node on the checkout's bin by absolute path; --config when the server has one", () => {
    const l = installLayout(REPO, { env: { HOME } });
    expect(cliCommand({ layout: l, configFile: null }, approve)).toBe(
      `node ${join(REPO, "bin", "tpu-mcp.js")} approvals approve apr_0123`,
    );
    expect(cliCommand({ layout: l, configFile: "/etc/tpu mcp/c.json" }, approve)).toBe(
      `node ${join(REPO, "bin", "tpu-mcp.js")} approvals approve apr_0123 --config '/etc/tpu mcp/c.json'`,
    );
  });

  it("a package in npx's cache: `npx -y tpu-mcp`, no --home at the default folder", () => {
    const root = packageAt(join(".npm", "_npx", "9f1c", "node_modules", "tpu-mcp"));
    const l = installLayout(root, { env: { HOME } });
    expect(l.kind).toBe("package");
    expect(cliProgram(l)).toBe("npx -y tpu-mcp");
    expect(cliCommand({ layout: l, configFile: null }, approve)).toBe(
      "npx -y tpu-mcp approvals approve apr_0123",
    );
  });

  it("a package with a folder of its own (--home, TPU_MCP_HOME, XDG_DATA_HOME) names it", () => {
    const root = packageAt(join("npx2", "_npx", "9f1c", "node_modules", "tpu-mcp"));
    for (const inputs of [
      { env: { HOME }, home: "/data/tpu" },
      { env: { HOME, TPU_MCP_HOME: "/data/tpu" } },
      { env: { HOME, XDG_DATA_HOME: "/data" } },
    ]) {
      const l = installLayout(root, inputs);
      const home = inputs.env.XDG_DATA_HOME ? "/data/tpu-mcp" : "/data/tpu";
      expect(
        cliCommand({ layout: l, configFile: "/c.json" }, approve),
        JSON.stringify(inputs),
      ).toBe(`npx -y tpu-mcp approvals approve apr_0123 --home ${home} --config /c.json`);
    }
    // The default folder given explicitly is still the default: nothing to add.
    const same = installLayout(root, { env: { HOME }, home: `${HOME}/.local/share/tpu-mcp` });
    expect(cliCommand({ layout: same, configFile: null }, approve)).toBe(
      "npx -y tpu-mcp approvals approve apr_0123",
    );
  });

  it("a package outside npx's cache (global, project, desktop bundle): its bin by absolute path", () => {
    const root = packageAt(join("my bundle", "tpu-mcp"));
    const l = installLayout(root, { env: { HOME, TPU_MCP_HOME: "/x y/h" } });
    expect(cliCommand({ layout: l, configFile: null }, approve)).toBe(
      `node '${join(root, "bin", "tpu-mcp.js")}' approvals approve apr_0123 --home '/x y/h'`,
    );
  });

  it("a layout forced by TPU_MCP_LAYOUT is forced again in the command", () => {
    const l = installLayout(REPO, { env: { HOME, TPU_MCP_LAYOUT: "package" }, home: "/h" });
    expect(cliCommand({ layout: l, configFile: null }, approve)).toBe(
      `TPU_MCP_LAYOUT=package node ${join(REPO, "bin", "tpu-mcp.js")} approvals approve apr_0123 --home /h`,
    );
  });

  it("a console on the same data: the http command with the same flags, where a console is built", () => {
    const root = packageAt(join("console", "_npx", "1", "node_modules", "tpu-mcp"));
    const l = layoutOf("package", root, { env: { HOME }, home: "/h" });
    const target = { layout: l, configFile: null };
    expect(consoleStart(target, 7801)).toBeUndefined(); // no dist/console: none can be served
    mkdirSync(l.consoleAssets, { recursive: true });
    writeFileSync(join(l.consoleAssets, "index.html"), "<!doctype html>");
    expect(consoleStart(target, 7801)).toEqual({
      command: "npx -y tpu-mcp http --home /h",
      url: "http://localhost:7801/console/",
    });
    expect(consoleStart(target, 0)).toEqual({ command: "npx -y tpu-mcp http --home /h" });
  });
});

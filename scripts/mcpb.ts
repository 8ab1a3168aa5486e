// The Claude Desktop extension (an MCP Bundle, .mcpb): `npx tsx scripts/mcpb.ts` builds
// dist/mcpb/ (manifest.json + server/, the npm package as `npm pack` makes it with its production
// node_modules), validates it with the official CLI (`mcpb validate`) and packs it
// (`mcpb pack`) into dist/tpu-mcp-<version>.mcpb.
//
// The server runs over stdio (`node server/bin/tpu-mcp.js stdio`, Node ships with Claude
// Desktop); the user may pick a config file and the data folder (the venv, the model files and
// the server's data: TPU_MCP_HOME). The first start sets up the Python side in the background and
// answers runtime_setting_up until it is done (server/setup/background.ts).
//
// better-sqlite3 is a native module: the bundle carries the build for the platform it was made
// on (compatibility.platforms says which), copied from this checkout's node_modules.
import { execFileSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { readCatalog } from "../runtime/catalog.js";
import { parseConfig } from "../server/config/config.js";
import { buildTools } from "../tools/registry.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The official CLI (a devDependency), else one on PATH. */
export function mcpbCli(): string[] {
  const local = join(ROOT, "node_modules", "@anthropic-ai", "mcpb", "dist", "cli", "cli.js");
  return existsSync(local) ? [process.execPath, local] : ["mcpb"];
}

export function mcpbManifest(): Record<string, any> {
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const config = parseConfig({}, { root: ROOT });
  const tools = buildTools({
    catalog: readCatalog(config.paths.catalog),
    limits: {
      max_texts: config.inference.max_texts,
      inline_max_elements: config.inference.inline_max_elements,
      max_tensor_elements: config.inference.max_tensor_elements,
      benchmark: { ...config.benchmark },
    },
  });
  return {
    manifest_version: "0.3",
    name: pkg.name,
    display_name: "tpu-mcp",
    version: pkg.version,
    description: pkg.description,
    long_description:
      "Inspect the accelerator runtime, load a model from the built-in catalog (a real SmolLM2 chat model among them), run inference and benchmarks, behind one policy gate: scopes, limits, budgets and human approval for costly work. The first start makes its Python environment (torch, CPU build) in the data folder, a few minutes once; device tools answer runtime_setting_up meanwhile. " +
      platformNote(),
    author: { name: "tpu-mcp contributors" },
    license: pkg.license,
    keywords: pkg.keywords,
    server: {
      type: "node",
      entry_point: "server/bin/tpu-mcp.js",
      mcp_config: {
        command: "node",
        args: ["${__dirname}/server/bin/tpu-mcp.js", "stdio"],
        env: {
          TPU_MCP_CONFIG: "${user_config.config_file}",
          TPU_MCP_HOME: "${user_config.data_dir}",
        },
      },
    },
    user_config: {
      config_file: {
        type: "file",
        title: "Config file",
        description:
          "A tpu-mcp JSON config (your own catalog, policy, limits). Empty: the built-in defaults.",
        required: false,
      },
      data_dir: {
        type: "directory",
        title: "Data folder",
        description:
          "Where the Python environment, the model files and the server's data live. Empty: ~/.local/share/tpu-mcp (XDG_DATA_HOME).",
        required: false,
      },
    },
    tools: tools.map((t) => ({ name: t.name, description: t.description })),
    compatibility: {
      platforms: [process.platform],
      runtimes: { node: ">=20.0.0", python: ">=3.11" },
    },
  };
}

/**
 * What the bundle runs on, said plainly: the native module inside is the one built here, so the
 * bundle is for this platform and CPU only; and nobody signed it.
 */
export function platformNote(): string {
  const os = { linux: "Linux", darwin: "macOS", win32: "Windows" }[process.platform as string];
  return `This bundle runs on ${os ?? process.platform} (${process.arch}) only: its native SQLite module (better-sqlite3) is the one built where the bundle was made, for this platform and CPU. Elsewhere, add tpu-mcp with npx instead (command npx, args -y tpu-mcp stdio), which builds or downloads the module for your machine. The bundle is not signed.`;
}

/** dist/mcpb/ with the manifest and the package; returns the folder. */
export function stageBundle(dir = join(ROOT, "dist", "mcpb")): string {
  rmSync(dir, { recursive: true, force: true });
  const server = join(dir, "server");
  mkdirSync(server, { recursive: true });
  const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-mcpb-"));
  try {
    const packed = execFileSync("npm", ["pack", "--pack-destination", scratch], {
      cwd: ROOT,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"],
    });
    const tarball = join(scratch, packed.trim().split("\n").pop()!);
    execFileSync("tar", ["xzf", tarball, "-C", server, "--strip-components=1"]);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  // Production dependencies only; the one native module comes from this checkout's build.
  execFileSync(
    "npm",
    ["install", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--no-package-lock"],
    { cwd: server, stdio: ["ignore", "inherit", "inherit"] },
  );
  const addon = join("node_modules", "better-sqlite3", "build", "Release", "better_sqlite3.node");
  mkdirSync(dirname(join(server, addon)), { recursive: true });
  cpSync(join(ROOT, addon), join(server, addon));
  writeFileSync(join(dir, "manifest.json"), JSON.stringify(mcpbManifest(), null, 2) + "\n");
  return dir;
}

/** Validates the staged manifest and packs it; returns the .mcpb file. */
export function packBundle(dir: string, out = join(ROOT, "dist")): string {
  const [cmd, ...pre] = mcpbCli();
  execFileSync(cmd, [...pre, "validate", join(dir, "manifest.json")], { stdio: "inherit" });
  const version = JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8")).version;
  const file = join(out, `tpu-mcp-${version}.mcpb`);
  execFileSync(cmd, [...pre, "pack", dir, file], { stdio: "inherit" });
  return file;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const file = packBundle(stageBundle());
  process.stderr.write(`[mcpb] ${file}\n`);
}

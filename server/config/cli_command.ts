// The tpu-mcp command line as an operator pastes it into a shell in any folder: the program is
// how this server was installed, and --home/--config are named when a bare command would not
// find the same data. Approval messages, webhooks and the MCP App card all print these.
import { existsSync } from "node:fs";
import { join, sep } from "node:path";
import { shellWord } from "../../lib/text.js";
import { installKind, type InstallLayout } from "./install_layout.js";

/** What decides the command: where the code lives and which data it serves. */
export interface CliTarget {
  layout: InstallLayout;
  /** The server's config file, absolute; null on the defaults. */
  configFile: string | null;
}

/**
 * The program: `npx -y tpu-mcp` for a package npx runs from its cache (the command the user
 * gave their host; the cache's folder is npm's to replace), else node on this code's bin by
 * absolute path (a clone, a global or project install, the desktop bundle), which runs from any
 * folder. A layout forced by TPU_MCP_LAYOUT is forced again, or the command reads other data.
 */
export function cliProgram(layout: InstallLayout): string {
  const npx = layout.kind === "package" && layout.root.split(sep).includes("_npx");
  const program = npx
    ? "npx -y tpu-mcp"
    : `node ${shellWord(join(layout.root, "bin", "tpu-mcp.js"))}`;
  const forced = installKind(layout.root) !== layout.kind;
  return forced ? `TPU_MCP_LAYOUT=${layout.kind} ${program}` : program;
}

/** `program args… [--home H] [--config F]`, each word quoted for the shell where it needs it. */
export function cliCommand(target: CliTarget, args: string[]): string {
  const { layout, configFile } = target;
  const words = [cliProgram(layout), ...args.map(shellWord)];
  if (layout.home && layout.homeGiven) words.push("--home", shellWord(layout.home));
  if (configFile) words.push("--config", shellWord(configFile));
  return words.join(" ");
}

export interface ConsoleStart {
  command: string;
  url?: string;
}

/**
 * How an operator opens a console on the same data while this server has none of its own (over
 * stdio): the HTTP server's command and the console's address on the configured port. Undefined
 * when this install has no built console to serve.
 */
export function consoleStart(target: CliTarget, port: number): ConsoleStart | undefined {
  if (!existsSync(join(target.layout.consoleAssets, "index.html"))) return undefined;
  const command = cliCommand(target, ["http"]);
  // Port 0 picks a free port at start: the address is the one the server prints.
  return port > 0 ? { command, url: `http://localhost:${port}/console/` } : { command };
}

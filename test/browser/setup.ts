// globalSetup for the browser suite: Debian's chromium must be there (playwright-core cannot
// download its own browser here). CI runs as root, so it is installed with apt-get when missing;
// elsewhere the error says what to run. Then the console is built if console/ changed.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { scaled } from "../helpers/calibrate.js";

const CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"];

export function chromiumPath(): string | undefined {
  const env = process.env.TPU_MCP_CHROMIUM;
  if (env) return existsSync(env) ? env : undefined;
  return CANDIDATES.find((p) => existsSync(p));
}

function apt(args: string[]) {
  const r = spawnSync("apt-get", args, {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    timeout: scaled(900_000),
  });
  return r.status === 0;
}

export default async function setup(): Promise<void> {
  if (!chromiumPath()) {
    if (process.getuid?.() !== 0) {
      throw new Error(
        "the browser tests need Debian's chromium: run `sudo apt-get install -y chromium` (or set TPU_MCP_CHROMIUM to a Chrome/Chromium binary)",
      );
    }
    process.stderr.write("[browser] installing chromium with apt-get…\n");
    if (!apt(["install", "-y", "--no-install-recommends", "chromium"])) {
      apt(["update"]);
      if (!apt(["install", "-y", "--no-install-recommends", "chromium"]))
        throw new Error("apt-get install chromium failed; install it by hand and rerun");
    }
    if (!chromiumPath()) throw new Error("chromium is still missing after apt-get install");
  }
  const { buildConsole, consoleIsStale } = await import("../../scripts/build_console.mjs");
  if (consoleIsStale()) await buildConsole();
}

// The one native module, better-sqlite3: compiled at install unless a prebuilt binary fits this
// platform and Node. When it is missing or broken, `npx -y tpu-mcp` showed a host only
// "Connection closed" and left the reason in npm's log; here it is told, with what to do.
import { join } from "node:path";
import { homedir } from "node:os";
import Database from "better-sqlite3";

/** Loads the module and opens a database in memory: what it threw, or null when it works. */
export function probeSqlite(nativeBinding?: string): unknown {
  try {
    new Database(":memory:", nativeBinding ? { nativeBinding } : {}).close();
    return null;
  } catch (e) {
    return e;
  }
}

/** Whether `e` is the module failing to load (rather than an error of one database file). */
export function isNativeLoadError(e: unknown): boolean {
  const { code, message } = (e ?? {}) as { code?: string; message?: string };
  const text = String(message ?? "");
  if (code === "ERR_DLOPEN_FAILED") return true;
  if (
    (code === "MODULE_NOT_FOUND" || code === "ERR_MODULE_NOT_FOUND") &&
    /better[-_]sqlite3|\.node\b/.test(text)
  )
    return true;
  return /Could not locate the bindings file|NODE_MODULE_VERSION|compiled against a different Node\.js version/.test(
    text,
  );
}

/** The message for a failed load: the reason, where npm logged the build, and the ways out. */
export function nativeModuleHelp(e: unknown, env: Record<string, string | undefined> = {}): string {
  const reason = String((e as Error)?.message ?? e)
    .split("\n")[0]!
    .trim();
  const cache = env.npm_config_cache || join(env.HOME || homedir(), ".npm");
  const abi = /NODE_MODULE_VERSION|different Node\.js version/.test(String((e as Error)?.message));
  const node = `Node ${process.version} on ${process.platform}-${process.arch}`;
  return [
    `tpu-mcp cannot load its native SQLite module (better-sqlite3): ${reason}`,
    `It is compiled when tpu-mcp is installed, unless a prebuilt binary fits ${node}.`,
    ...(abi
      ? [
          "- It was built for another Node version: Node changed since the install. Remove npx's copy " +
            `(rm -rf ${join(cache, "_npx")}) or reinstall tpu-mcp, so it is built for this Node.`,
        ]
      : []),
    `- Why the build failed: npm's log of the install, the newest *-debug-0.log in ${join(cache, "_logs")}.`,
    "- A prebuilt binary: use a Node LTS release (20, 22 or 24) on Linux, macOS or Windows (x64 or " +
      `arm64), then remove npx's copy (rm -rf ${join(cache, "_npx")}) and start again.`,
    "- Or install the build tools and reinstall: Python 3, make and a C++ compiler (Debian/Ubuntu: " +
      "sudo apt install build-essential python3; macOS: xcode-select --install; Windows: the Visual " +
      "Studio Build Tools, C++ workload).",
    "- A desktop host gives a server about 60 s to start, less than a compile: run " +
      "`npx -y tpu-mcp --version` once in a terminal, so the host finds it built.",
    "docs/troubleshooting.md, “The native module (better-sqlite3)”.",
  ].join("\n");
}

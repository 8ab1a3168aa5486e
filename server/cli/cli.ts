// `tpu-mcp` command line: the only place that reads argv and process.env or calls process.exit.
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync, chmodSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import type { ApprovalStatus } from "../../policies/approval_record.js";
import { hashToken } from "../../policies/config.js";
import { ConfigError, loadConfig, withToken, type ServerConfig } from "../config/config.js";
import { installLayout, type InstallLayout } from "../config/install_layout.js";
import { inertSettings } from "../config/inert.js";
import { SetupWatch } from "../setup/background.js";
import { needsSetup, runSetup } from "../setup/run.js";
import { writeUserCatalog } from "../setup/user_catalog.js";
import { checkUserHome } from "../setup/user_home.js";
import { SERVER_VERSION } from "../version.js";
import { checkSecretFile, createDataDir, dataDir } from "../config/data_dir.js";
import { createApp, type App } from "../app/app.js";
import { runApprovalsCommand, runAuditCommand } from "./operator.js";
import { runOperatorsCommand } from "./operators.js";
import { runPrincipalsCommand } from "./principals.js";
import { runDoctor } from "../doctor/index.js";
import { runTpuSelfTest } from "../doctor/tpu.js";
import { startHttp } from "../transports/http.js";
import { createLogger, isLogFormat } from "../app/logger.js";
import { startStdio } from "../transports/stdio.js";
import { terminalText } from "../terminal.js";
import { runVerifyExport } from "./verify_export.js";
import { runWorkersCommand } from "./workers.js";
import { runStorageCommand } from "./storage.js";
import { openSharedBackend, redactedConfig } from "../app/storage.js";
import { replicaIdentity } from "../app/replica.js";
import { checkDataDirAccess, isAccessDenied } from "./data_dir_access.js";
import { isNativeLoadError, nativeModuleHelp, probeSqlite } from "../app/native_module.js";
import { answerWithReason } from "../transports/failed_start.js";

/** The repository root: the first folder above this module with a package.json (the source sits
 * in server/cli/, the bundle in dist/, so a fixed number of ".." would be wrong for one of them). */
function packageRoot(from: string): string {
  for (let dir = dirname(from); ; dir = dirname(dir)) {
    if (existsSync(join(dir, "package.json"))) return dir;
    if (dirname(dir) === dir) throw new Error(`no package.json above ${from}`);
  }
}

const ROOT = packageRoot(fileURLToPath(import.meta.url));

/** The commands that open a SQLite store (the policy stores, workers.db). */
const SQLITE_COMMANDS = [
  "stdio",
  "http",
  "approvals",
  "audit",
  "principals",
  "operators",
  "workers",
];

const USAGE = `usage: tpu-mcp <command> [options]

commands:
  stdio                         serve MCP over stdin/stdout (desktop assistants)
  setup [--home DIR]            make the Python environment and the built-in model files
                                (an installed package: in the per-user folder; progress on stderr)
  http [--host H] [--port P]    serve MCP over Streamable HTTP (default 127.0.0.1:7801)
       [--no-auth]              no bearer token (loopback only; for local experiments)
  doctor                        versions, devices found and why, catalog and config problems
  doctor --tpu [--json]         TPU VM self-test: every chip × eager mode, memory, sync, precision,
                                a forward per built-in model (eager and compile); attach to bug reports
  approvals list [--limit N] [--offset N] [--status S] | show ID | approve ID | deny ID
             [--reason R] [--token T]
                                decide pending approvals (operator token: --token or TPU_MCP_TOKEN;
                                with no tokens in the config, the generated <data_dir>/operator-token);
                                list shows every pending one first, then the rest, a page at a time
  audit tail [-n N] | head | verify [--head FILE]
                                read the audit trail, export its head (store it elsewhere),
                                verify the keyed chain (and that it still holds an exported head)
  audit export --since SEQ|ISO-TIME [--format jsonl|ocsf] [--out FILE]
                                the records from there on with their proof fields, then the head
  audit verify-export FILE --head HASH|HEADFILE
                                a receiver's check (no data dir, no key): FILE is a gap-free,
                                unmodified segment of the chain ending at that head's export_hash
  principals list | suspended | resume ID [--token T]
                                the config's principals and who an alert rule suspended;
                                resume lifts a suspension (operator token, audited)
  operators enrol NAME | list | remove NAME
                                operators' passkeys: a one-time code for NAME's first passkey
                                (the console enrols it), the list, removal (lost passkey)
  token new | hash TOKEN        make a token and print its sha256 for the config
  --version, -v                 print the version
  config show                   the effective config as JSON: the file over the defaults
                                (e.g. the approval rules that apply when the file names none)
  storage migrate | check       the shared store (storage.postgres): apply its schema; check it is
                                reachable, its schema version and this machine's clock against it
  workers [list] | drain NAME | undrain NAME | scale N | reload [--token T]
                                the worker pool: state, placement; drain (admin token) stops
                                routing to a worker and waits for its calls in flight

common options:
  --config FILE                 JSON config (see README); defaults serve the built-in CPU catalog
  --device D                    auto, cpu, cuda[:N], tpu[:N] or xla[:N] (overrides the config)
  --home DIR                    an installed package's per-user folder (venv, models, data);
                                default $TPU_MCP_HOME, else $XDG_DATA_HOME/tpu-mcp
`;

// Every line the CLI prints passes through terminalText: no caller-made text can drive the terminal.
const print = (stream: NodeJS.WriteStream, s: string) => {
  const safe = terminalText(s);
  stream.write(safe.endsWith("\n") ? safe : safe + "\n");
};
const out = (s: string) => print(process.stdout, s);
const err = (s: string) => print(process.stderr, s);

/** A token generated into the data dir (0600) and kept there, so clients keep working. */
function generatedToken(config: ServerConfig, file: string, what: string): string {
  if (existsSync(file)) {
    checkSecretFile(file, what);
    return readFileSync(file, "utf8").trim();
  }
  createDataDir(config, { warn: err });
  const token = `tpu_${randomBytes(24).toString("base64url")}`;
  writeFileSync(file, token + "\n", { mode: 0o600 });
  chmodSync(file, 0o600);
  return token;
}

/** No tokens and no JWT in the config: the server generates its own (the embedded default). */
const embeddedAuth = (config: ServerConfig) =>
  config.policy.tokens.length === 0 && !config.policy.jwt;

/**
 * The embedded default's operator: someone other than the agent who may decide approvals, and
 * read the runtime (the console's Runtime page calls get_runtime_status through the gate). Its
 * token lives in the data dir, so whoever can read that folder can approve: run the server as
 * its own user to keep an agent out (docs/security.md).
 */
const LOCAL_OPERATOR = {
  id: "local-operator",
  scopes: ["approvals:grant" as const, "models:read" as const],
};

function withOperatorToken(config: ServerConfig): { config: ServerConfig; token: string } {
  const token = generatedToken(config, dataDir(config).operatorToken, "the operator token");
  return {
    token,
    config: withToken(config, { ...LOCAL_OPERATOR, token_sha256: hashToken(token) }),
  };
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (!command || command === "--help" || command === "-h" || command === "help") {
    out(USAGE);
    return command ? 0 : 2;
  }
  if (command === "--version" || command === "-v" || command === "version") {
    out(SERVER_VERSION);
    return 0;
  }
  const { values, positionals } = parseArgs({
    args: rest,
    allowPositionals: true,
    options: {
      config: { type: "string" },
      device: { type: "string" },
      host: { type: "string" },
      port: { type: "string" },
      "no-auth": { type: "boolean" },
      token: { type: "string" },
      reason: { type: "string" },
      n: { type: "string", short: "n" },
      json: { type: "boolean" },
      head: { type: "string" },
      tpu: { type: "boolean" },
      limit: { type: "string" },
      offset: { type: "string" },
      status: { type: "string" },
      home: { type: "string" },
      since: { type: "string" },
      format: { type: "string" },
      out: { type: "string" },
    },
  });

  // A receiver's check: no config, data dir or key.
  if (command === "audit" && positionals[0] === "verify-export")
    return runVerifyExport(positionals[1], values.head, { out, err, json: values.json === true });

  if (command === "token") {
    const [sub, plain] = positionals;
    if (sub === "new") {
      const t = `tpu_${randomBytes(24).toString("base64url")}`;
      out(`token:        ${t}\ntoken_sha256: ${hashToken(t)}`);
      return 0;
    }
    if (sub === "hash" && plain) {
      out(hashToken(plain));
      return 0;
    }
    err("usage: tpu-mcp token new | tpu-mcp token hash TOKEN");
    return 2;
  }

  const layout = installLayout(ROOT, { env: process.env, home: values.home });
  // Nothing runs from a per-user folder someone else can write; the doctor reports it as a check.
  const homeRefused = checkUserHome(layout);
  if (homeRefused && command !== "doctor") {
    err(homeRefused.message);
    return 1;
  }
  if (command === "setup") return runSetupCommand(layout);
  // An installed package reads the shipped catalog with its model roots in the per-user folder.
  if (!homeRefused) writeUserCatalog(layout);
  let config: ServerConfig;
  try {
    config = loadConfig(
      values.config ?? process.env.TPU_MCP_CONFIG,
      ROOT,
      { device: values.device },
      layout,
    );
  } catch (e) {
    if (e instanceof ConfigError) {
      err(e.message);
      return 2;
    }
    throw e;
  }
  const logFormat = process.env.TPU_MCP_LOG_FORMAT ?? config.log_format;
  if (!isLogFormat(logFormat)) {
    err(`TPU_MCP_LOG_FORMAT must be auto, json or pretty, got ${JSON.stringify(logFormat)}`);
    return 2;
  }
  const logger = createLogger(
    process.env.TPU_MCP_LOG_LEVEL ?? config.log_level,
    process.stderr,
    logFormat,
  );
  // A reload reads the same file with the same command-line overrides (none without a file).
  const configFile = values.config ?? process.env.TPU_MCP_CONFIG;
  const reloadable = configFile
    ? () => loadConfig(configFile, ROOT, { device: values.device }, layout)
    : undefined;

  // The commands that work on the server's state refuse plainly when the data dir is another
  // user's (the server running as its own user), rather than failing deep inside or listing nothing.
  if (["approvals", "audit", "operators", "workers", "principals"].includes(command)) {
    const refusal = checkDataDirAccess(config.paths.data_dir, command);
    if (refusal) {
      err(refusal);
      return 1;
    }
  }

  // The commands that open a store need the native SQLite module: a failed build is told here,
  // with what to do, not as a stack trace deep inside (or "Connection closed" in a host).
  if (SQLITE_COMMANDS.includes(command)) {
    const failed = probeSqlite();
    if (failed) {
      const help = nativeModuleHelp(failed, process.env);
      err(help);
      if (command === "stdio") await answerWithReason(help);
      return 1;
    }
  }

  switch (command) {
    case "stdio": {
      const replica = replicaIdentity(config, null);
      const shared = await openSharedBackend(config, logger, replica);
      const app = await createApp(config, logger, {
        loadConfig: reloadable,
        ...setupWatch(layout, config, logger),
        replica,
        shared,
      }).catch(async (e) => {
        // Refused at start: the shared backend's pool ends with it, so the process exits.
        await shared?.close();
        throw e;
      });
      const stopHup = onSighup(app);
      const { closed } = await startStdio(app);
      await closed;
      stopHup();
      await app.close();
      await shared?.close();
      return 0;
    }
    case "http": {
      const host = values.host ?? config.http.host;
      const port = values.port !== undefined ? Number(values.port) : config.http.port;
      if (!Number.isInteger(port) || port < 0 || port > 65535) {
        err(`--port must be an integer 0-65535, got ${values.port}`);
        return 2;
      }
      const noAuth = values["no-auth"] === true;
      let token: string | undefined;
      const fileConfig = config;
      let operatorFile: string | undefined;
      if (!noAuth && embeddedAuth(config)) {
        token = generatedToken(config, dataDir(config).localToken, "the generated bearer token");
        config = withToken(config, {
          id: config.policy.stdio_principal.id,
          token_sha256: hashToken(token),
          scopes: [...config.policy.stdio_principal.scopes],
        });
        config = withOperatorToken(config).config;
        operatorFile = dataDir(config).operatorToken;
      }
      // On Postgres: connected, migrated and keyed before anything is built (storage.ts).
      const replica = replicaIdentity(config, { port });
      const shared = await openSharedBackend(config, logger, replica);
      const app = await createApp(config, logger, {
        loadConfig: reloadable,
        fileConfig,
        replica,
        shared,
        ...setupWatch(layout, config, logger),
      }).catch(async (e) => {
        await shared?.close();
        throw e;
      });
      const stopHup = onSighup(app);
      let running;
      try {
        running = await startHttp(app, { host, port, noAuth });
      } catch (e) {
        err(`cannot serve HTTP: ${(e as Error).message}`);
        stopHup();
        await app.close();
        await shared?.close();
        return 1;
      }
      err(`\ntpu-mcp is serving MCP (Streamable HTTP) at ${running.url}`);
      if (token) {
        err(`bearer token (generated, kept in ${dataDir(config).localToken}):\n  ${token}`);
      } else if (noAuth) {
        err("no authentication (--no-auth): every caller is 'anonymous'");
      } else {
        err("bearer tokens: as configured in the policy section of the config");
      }
      err(
        `connect: any MCP client with URL ${running.url} and header "Authorization: Bearer <token>"\n` +
          // localhost, not 127.0.0.1: browsers allow passkeys only in a secure context.
          `console: ${running.url.replace(/\/mcp$/, "/console/").replace("//127.0.0.1:", "//localhost:")} (operators: sign in with a passkey, or with ${operatorFile ? `the operator token in ${operatorFile}` : "a token holding approvals:grant or admin"})\n` +
          `health: ${running.url.replace(/\/mcp$/, "/healthz")}  metrics: ${running.url.replace(/\/mcp$/, "/metrics")}\n` +
          "stop with Ctrl-C\n",
      );
      await new Promise<void>((resolve) => {
        process.once("SIGINT", resolve);
        process.once("SIGTERM", resolve);
      });
      stopHup();
      await running.close();
      await app.close();
      await shared?.close();
      return 0;
    }
    case "doctor":
      if (values.tpu) return runTpuSelfTest(config, { out, json: values.json === true });
      return runDoctor(config, { out, err, json: values.json === true });
    case "approvals": {
      let token = values.token ?? process.env.TPU_MCP_TOKEN;
      // The embedded default decides with its generated operator token (made on first use):
      // the one it uses when none is given, and the one it knows when it is given explicitly.
      const deciding = positionals[0] === "approve" || positionals[0] === "deny";
      if (deciding && embeddedAuth(config)) {
        const operator = withOperatorToken(config);
        config = operator.config;
        token ??= operator.token;
      }
      return runApprovalsCommand(config, positionals, {
        token,
        reason: values.reason,
        paging: {
          limit: values.limit !== undefined ? Number(values.limit) : undefined,
          offset: values.offset !== undefined ? Number(values.offset) : undefined,
          status: values.status as ApprovalStatus | undefined,
        },
        json: values.json === true,
        out,
        err,
        logger,
      });
    }
    case "config":
      if (positionals[0] !== "show") {
        err("usage: tpu-mcp config show [--config FILE]");
        return 2;
      }
      out(JSON.stringify(redactedConfig(config), null, 2));
      // On stderr: stdout stays the config as JSON.
      for (const note of inertSettings(config)) err(`note: ${note}`);
      return 0;
    case "audit":
      return runAuditCommand(config, positionals, {
        n: values.n ? Number(values.n) : 20,
        head: values.head,
        since: values.since,
        format: values.format,
        outFile: values.out,
        json: values.json === true,
        out,
        err,
        logger,
      });
    case "principals": {
      let token = values.token ?? process.env.TPU_MCP_TOKEN;
      // As approvals approve: the embedded default resumes with its generated operator token.
      if (positionals[0] === "resume" && embeddedAuth(config)) {
        const operator = withOperatorToken(config);
        config = operator.config;
        token ??= operator.token;
      }
      return runPrincipalsCommand(config, positionals, {
        token,
        json: values.json === true,
        out,
        err,
        logger,
      });
    }
    case "operators":
      return runOperatorsCommand(config, positionals, {
        json: values.json === true,
        out,
        err,
        logger,
      });
    case "storage":
      return runStorageCommand(config, positionals, {
        json: values.json === true,
        out,
        err,
        logger,
      });
    case "workers":
      return runWorkersCommand(config, positionals, {
        token: values.token ?? process.env.TPU_MCP_TOKEN,
        json: values.json === true,
        out,
        err,
        logger,
      });
    default:
      err(`unknown command ${command}\n\n${USAGE}`);
      return 2;
  }
}

/**
 * Exits once what was written to stdout and stderr has left the process: writes to a pipe are
 * asynchronous, and process.exit drops those still queued (an `audit export` piped to a slow
 * reader lost its last records). An empty write's callback runs after every write before it. A
 * stream whose reader is gone (EPIPE) counts as flushed; a reader that takes nothing for a minute
 * is given up on, so a stuck pipe never keeps the process alive.
 */
function exitWhenFlushed(code: number): void {
  const streams = [process.stdout, process.stderr].filter((s) => s.writable && !s.destroyed);
  let open = streams.length;
  const flushed = () => --open <= 0 && process.exit(code);
  if (open === 0) process.exit(code);
  setTimeout(() => process.exit(code), 60_000);
  for (const s of streams) {
    s.once("error", flushed);
    s.write("", flushed);
  }
}

main(process.argv.slice(2)).then(exitWhenFlushed, (e) => {
  if (isNativeLoadError(e)) {
    err(nativeModuleHelp(e, process.env));
    return exitWhenFlushed(1);
  }
  const hint = isAccessDenied(e)
    ? " (a file of another user: run the command as the server's user, docs/security.md)"
    : "";
  err(`tpu-mcp: ${(e as Error)?.message ?? e}${hint}`);
  exitWhenFlushed(1);
});

/** `tpu-mcp setup`: an installed package's Python environment and model files; a clone's set-up. */
async function runSetupCommand(layout: InstallLayout): Promise<number> {
  if (layout.kind === "clone") {
    const r = spawnSync(process.execPath, [join(layout.root, "scripts", "setup.mjs")], {
      stdio: ["ignore", process.stderr, process.stderr],
    });
    return r.status ?? 1;
  }
  const ok = await runSetup(layout, {
    say: err,
    env: process.env,
    version: SERVER_VERSION,
  });
  return ok ? 0 : 1;
}

/**
 * A server of an installed package that has not been set up: it serves at once and sets up in
 * the background (server/setup/background.ts). Nothing from a clone, or once set up.
 */
function setupWatch(
  layout: InstallLayout,
  config: ServerConfig,
  logger: ReturnType<typeof createLogger>,
): { setup?: SetupWatch } {
  // A config that names its own Python has its own environment: nothing to set up here.
  if (config.paths.python !== layout.python || !needsSetup(layout, SERVER_VERSION)) return {};
  const command = [process.execPath, process.argv[1], "setup"];
  if (layout.home) command.push("--home", layout.home);
  return {
    setup: new SetupWatch(layout, { version: SERVER_VERSION, command, env: process.env, logger }),
  };
}

/** SIGHUP re-reads the config file (docs/fleet-and-ray.md, "Config reload"); returns the un-registration. */
function onSighup(app: App): () => void {
  const fn = () => void app.reload("SIGHUP");
  process.on("SIGHUP", fn);
  return () => process.off("SIGHUP", fn);
}

// The container image (examples/deploy/Containerfile) built for real from the npm package, run,
// and answering a tool call over HTTP; its health check, label, user and volume inspected. Where
// this machine cannot build it (no container runtime, or no base image and no image registry
// within reach), the suite says why in one line and skips: it never passes without building.
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, copyFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { connectModernHttp } from "../helpers/modern.js";
import { ROOT } from "../helpers/server.js";
import { call } from "../e2e/scenario.js";
import { scaled } from "../helpers/calibrate.js";

const BASE = "node:22-bookworm-slim";
const TAG = "localhost/tpu-mcp-test:latest";
const ok = (cmd: string, ...args: string[]) =>
  spawnSync(cmd, args, { stdio: "ignore", timeout: scaled(20_000) }).status === 0;

/** The container CLI to use, or why there is none. */
function runtime(): { cli: string } | { reason: string } {
  if (ok("podman", "--version")) {
    if (!ok("podman", "image", "exists", BASE))
      return {
        reason: `podman is installed but the base image ${BASE} is not, and no image registry is reachable from this machine`,
      };
    return { cli: "podman" };
  }
  if (ok("docker", "info")) {
    if (!ok("docker", "image", "inspect", BASE))
      return {
        reason: `docker runs but the base image ${BASE} is not here, and no image registry is reachable`,
      };
    return { cli: "docker" };
  }
  return {
    reason:
      "no container runtime here (no podman, and the docker client has no daemon): `apt-get install -y podman` and a local " +
      BASE,
  };
}

const found = runtime();
const reason = "reason" in found ? found.reason : null;
if (reason) console.log(`[image suite] skipped: ${reason}`);

describe.skipIf(reason !== null)("the container image", () => {
  const cli = "cli" in found ? found.cli : "";
  const ctx = mkdtempSync(join(tmpdir(), "tpu-mcp-image-"));
  let container = "";
  afterAll(() => {
    if (container) spawnSync(cli, ["rm", "-f", container], { stdio: "ignore" });
    rmSync(ctx, { recursive: true, force: true });
  });

  it(
    "builds from the package, runs as its own user and answers a tool call",
    { timeout: scaled(1_800_000) },
    async () => {
      // The build context is what the Containerfile takes: the tarball and the container config.
      const packed = execFileSync("npm", ["pack", "--pack-destination", ctx], {
        cwd: ROOT,
        encoding: "utf8",
      });
      expect(packed).toMatch(/tpu-mcp-.*\.tgz/);
      mkdirSync(join(ctx, "examples", "deploy"), { recursive: true });
      for (const f of ["Containerfile", "config.container.json"])
        copyFileSync(join(ROOT, "examples", "deploy", f), join(ctx, "examples", "deploy", f));
      execFileSync(
        cli,
        ["build", "-f", join(ctx, "examples", "deploy", "Containerfile"), "-t", TAG, ctx],
        {
          stdio: "inherit",
          timeout: scaled(1_500_000),
        },
      );
      const inspect = JSON.parse(
        execFileSync(cli, ["image", "inspect", TAG], { encoding: "utf8" }),
      )[0];
      const config = inspect.Config ?? inspect.config;
      expect(config.Labels["io.modelcontextprotocol.server.name"]).toMatch(/\/tpu-mcp$/);
      expect(config.User).toBe("tpu-mcp");
      expect(Object.keys(config.Volumes ?? {})).toContain("/data");
      expect(config.Entrypoint).toEqual(["tpu-mcp"]);
      container = execFileSync(cli, ["run", "-d", "-p", "127.0.0.1::7801", TAG], {
        encoding: "utf8",
      }).trim();
      const port = execFileSync(cli, ["port", container, "7801"], { encoding: "utf8" })
        .trim()
        .split(":")
        .pop();
      const url = `http://127.0.0.1:${port}/mcp`;
      let token = "";
      for (let i = 0; i < 120 && !token; i++) {
        const logs = spawnSync(cli, ["logs", container], { encoding: "utf8" });
        token = /bearer token[^\n]*:\n\s+(\S+)/.exec(`${logs.stdout}${logs.stderr}`)?.[1] ?? "";
        if (!token) await new Promise((r) => setTimeout(r, 1000));
      }
      expect(token).not.toBe("");
      expect((await fetch(url.replace(/\/mcp$/, "/healthz"))).ok).toBe(true);
      const { client, close } = await connectModernHttp(url, token);
      try {
        const status = await call(client as any, "get_runtime_status", {});
        expect(status.isError, JSON.stringify(status.content)).toBeFalsy();
        expect(status.structuredContent.setup).toBeUndefined(); // set up at build time
      } finally {
        await close();
      }
    },
  );
});

// The embedded default in chromium: a server with no tokens in its config (what `npm start`
// serves), the operator signs in to the console with the token file the start banner names, as
// it says, and opens the Runtime page (get_runtime_status through the gate, which needs
// models:read).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHttpServer, type HttpServerProc } from "../helpers/server.js";
import { chromiumPath } from "./setup.js";

describe("the default local operator's console in chromium", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-default-console-"));
  let server: HttpServerProc;
  let browser: Browser;
  beforeAll(async () => {
    // Only the data dir differs from `npm start` (the shared .data is not this test's to change).
    const config = join(dir, "config.json");
    writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data") }));
    server = await startHttpServer(config);
    browser = await chromium.launch({
      executablePath: chromiumPath(),
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    });
  });
  afterAll(async () => {
    await browser?.close();
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("signs in with the banner's operator token and shows the Runtime page", async () => {
    const banner = /console: (\S+) \(operators: .* the operator token in (\S+)\)/.exec(
      server.stderr(),
    );
    expect(banner, server.stderr()).not.toBeNull();
    const [, consoleUrl, tokenFile] = banner!;
    const page = await (await browser.newContext()).newPage();
    await page.goto(consoleUrl!);
    await page.fill("#token", readFileSync(tokenFile!, "utf8").trim());
    await page.press("#token", "Enter");
    await page.waitForSelector("#pending h2");
    expect(await page.textContent("#who")).toContain("local-operator");
    await page.goto(`${consoleUrl}#/runtime`);
    await page.waitForSelector("#runtime dl");
    const text = await page.textContent("#runtime");
    expect(text).not.toContain("needs the models:read scope");
    expect(text).toMatch(/Devices \(\d+\)/);
  });
});

// The operator console and the MCP App view in a real browser (Debian's chromium driven by
// playwright-core) against a real server with a real worker. Agents speak MCP with the SDK's
// Client; operators click in the page.
//
// TPU_MCP_SCREENSHOTS=1 writes the screenshots under docs/ (docs/console.md shows them); otherwise
// they go to a temp folder.
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  chromium,
  type Browser,
  type BrowserContext,
  type BrowserContextOptions,
  type Page,
} from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { hashToken } from "../../policies/config.js";
import {
  ROOT,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
  DEMO_POLICY,
  DEMO_TOKENS,
} from "../helpers/server.js";
import { chromiumPath } from "./setup.js";
import { scaled } from "../helpers/calibrate.js";

const { agent: AGENT, reader: READER, operator: OPERATOR } = DEMO_TOKENS;
const SELF_OP = "console-self-operator-token";
const ADMIN = "console-admin-token";
const UI_MIME = "text/html;profile=mcp-app";
/** The extension's default CSP for a view that declares none (ext-apps spec, 2026-01-26). */
const APPS_DEFAULT_CSP =
  "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; " +
  "img-src 'self' data:; media-src 'self' data:; connect-src 'none'; object-src 'none'";
const SHOTS =
  process.env.TPU_MCP_SCREENSHOTS === "1"
    ? join(ROOT, "docs")
    : mkdtempSync(join(tmpdir(), "tpu-mcp-shots-"));
mkdirSync(SHOTS, { recursive: true });

const BENCH = { model: "mnist-cnn", batch_sizes: [1, 2, 4, 8], iterations: 6, warmup: 1 };
/**
 * The load signal the suite's worker reads (TPU_WORKER_PROC_ROOT: its /proc for load figures):
 * a host far busier than its cores, so every report is measured unstable whatever this machine's
 * own load, and the console and the MCP App must say so.
 */
const LOADED_PROC = mkdtempSync(join(tmpdir(), "tpu-mcp-loaded-proc-"));
writeFileSync(join(LOADED_PROC, "loadavg"), "64.00 64.00 64.00 65/900 4242\n");
// Other reasons (a wide interval on this shared machine) may come first.
const LOADED = /^unstable: (.+; )?load above cores \(64\.00 on \d+ CPUs\)$/;

describe("operator console in chromium", () => {
  let server: HttpServerProc;
  let base: string;
  let browser: Browser;
  let operator: BrowserContext;
  let page: Page;
  let agent: Awaited<ReturnType<typeof connectHttp>>;
  const extra: Server[] = [];
  /** CSP violations on any page or frame of any context (reported by chromium or the DOM event). */
  const cspViolations: string[] = [];

  /** Every context the suite opens: CSP violations in any of its pages fail the running test. */
  async function newContext(opts: BrowserContextOptions): Promise<BrowserContext> {
    const ctx = await browser.newContext(opts);
    // Init scripts run in every frame before the page's own scripts and are not subject to its CSP.
    await ctx.addInitScript(() => {
      document.addEventListener("securitypolicyviolation", (e) =>
        console.error(
          `[csp-violation] ${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.documentURI}`,
        ),
      );
    });
    ctx.on("page", (p) =>
      p.on("console", (m) => {
        const text = m.text();
        if (/\[csp-violation\]|Content Security Policy/i.test(text))
          cspViolations.push(`${p.url()}: ${text}`);
      }),
    );
    return ctx;
  }

  afterEach(() => {
    expect(cspViolations.splice(0), "CSP violations in chromium").toEqual([]);
  });

  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-console-"));
    const config = writeConfig(
      {
        policy: {
          ...DEMO_POLICY,
          tokens: [
            ...DEMO_POLICY.tokens,
            {
              id: "selfop",
              token_sha256: hashToken(SELF_OP),
              scopes: ["benchmark:run", "approvals:grant"],
            },
            { id: "admin", token_sha256: hashToken(ADMIN), scopes: ["admin"] },
          ],
          limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
          approvals: {
            ...DEMO_POLICY.approvals,
            rules: [{ tool: "run_benchmark", principals: ["agent", "selfop"] }],
          },
        },
      },
      dir,
    );
    // The server's environment reaches its worker (runtime/client/process.ts).
    process.env.TPU_WORKER_PROC_ROOT = LOADED_PROC;
    try {
      server = await startHttpServer(config);
    } finally {
      delete process.env.TPU_WORKER_PROC_ROOT;
    }
    base = server.url.replace(/\/mcp$/, "");
    browser = await chromium.launch({
      executablePath: chromiumPath(),
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    });
    operator = await newContext({ viewport: { width: 1280, height: 800 } });
    page = await operator.newPage();
    agent = await connectHttp(server.url, AGENT);
  });

  afterAll(async () => {
    await agent?.close();
    await browser?.close();
    await Promise.all(extra.map((s) => new Promise((r) => s.close(r))));
    await server?.stop();
  });

  async function signIn(p: Page, token: string) {
    await p.goto(`${base}/console/`);
    await p.fill("#token", token);
    await p.press("#token", "Enter");
  }

  /** A small HTTP server on loopback for pages that are not the console (attacker, MCP host). */
  async function serve(
    host: string,
    routes: Record<string, { type: string; body: string; headers?: Record<string, string> }>,
  ): Promise<string> {
    const s = createServer((req, res) => {
      const r = routes[(req.url ?? "/").split("?")[0]];
      if (!r) return res.writeHead(404).end();
      res.writeHead(200, { "content-type": r.type, ...(r.headers ?? {}) }).end(r.body);
    });
    extra.push(s);
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
    return `http://${host}:${(s.address() as AddressInfo).port}`;
  }

  it("refuses a wrong token and a reader's token, and sets no cookie", async () => {
    await signIn(page, "not-a-token");
    await expect.poll(() => page.textContent("#signin-error")).toContain("the token was refused");
    await signIn(page, READER);
    await expect
      .poll(() => page.textContent("#signin-error"))
      .toContain("holds neither approvals:grant nor admin");
    expect(await operator.cookies()).toEqual([]);
    expect(await page.isHidden("#nav")).toBe(true);
  });

  it("signs an operator in with an HttpOnly SameSite=Strict cookie; the token stays out of URLs and storage", async () => {
    await signIn(page, OPERATOR);
    await page.waitForSelector("#pending h2");
    expect(await page.textContent("#who")).toContain("operator");
    const [c] = await operator.cookies();
    expect(c).toMatchObject({ name: "tpu_console", httpOnly: true, sameSite: "Strict" });
    expect(page.url()).not.toContain(OPERATOR);
    const stored = await page.evaluate(() => [
      document.cookie,
      JSON.stringify(localStorage),
      JSON.stringify(sessionStorage),
    ]);
    expect(stored.join("")).not.toContain(OPERATOR);
    expect(stored[0]).toBe(""); // the session cookie is invisible to scripts
    expect(await page.locator("#token").count()).toBe(0);
  });

  let approvedReport = "";

  it("shows an agent's pending request without a reload; approving lets the agent's retry run", async () => {
    const loads: string[] = [];
    page.on("framenavigated", (f) => f === page.mainFrame() && loads.push(f.url()));
    const asked = await agent.client.callTool({ name: "run_benchmark", arguments: BENCH });
    expect(errorOf(asked)?.code).toBe("approval_required");
    const id = errorOf(asked)!.details.approval_id as string;
    const card = page.locator(`article.approval[data-id="${id}"]`);
    await card.waitFor();
    expect(loads).toEqual([]); // arrived over SSE, no navigation
    const text = await card.innerText();
    expect(text).toContain("agent");
    expect(text).toContain("run_benchmark");
    expect(text).toMatch(/device-s/);
    expect(text).toMatch(/expires in \d+ min/);
    expect(text).toContain("selfop"); // who else could decide
    const args = JSON.parse(await card.locator("pre.args").innerText());
    expect(args).toMatchObject({ model: "mnist-cnn", batch_sizes: [1, 2, 4, 8] });
    await page.screenshot({ path: join(SHOTS, "console-approvals.png") });

    await card.locator("button.approve").click();
    await card.waitFor({ state: "detached" });
    const row = page.locator("#history tr", { hasText: "approved" }).first();
    await row.waitFor();
    expect(await row.innerText()).toContain("operator");

    const done = await agent.client.callTool({
      name: "run_benchmark",
      arguments: { ...BENCH, approval_id: id },
    });
    expect(done.isError).toBeFalsy();
    approvedReport = (done.structuredContent as any).report_id;
    expect(approvedReport).toMatch(/^bench_/);
    await page.locator("#history tr", { hasText: "used" }).first().waitFor();
  });

  it("denies with a reason; the agent sees approval_denied with it", async () => {
    const args = { ...BENCH, batch_sizes: [16] };
    const asked = await agent.client.callTool({ name: "run_benchmark", arguments: args });
    const id = errorOf(asked)!.details.approval_id as string;
    const card = page.locator(`article.approval[data-id="${id}"]`);
    await card.waitFor();
    await card.locator("input[type=text]").fill("batch 16 is not needed today");
    await card.locator("button.deny").click();
    await card.waitFor({ state: "detached" });
    const retry = await agent.client.callTool({
      name: "run_benchmark",
      arguments: { ...args, approval_id: id },
    });
    expect(errorOf(retry)?.code).toBe("approval_denied");
    expect(errorOf(retry)?.message).toContain("batch 16 is not needed today");
    expect(errorOf(retry)?.message).toContain("operator");
  });

  it("refuses self-approval, in the page and at the API", async () => {
    const self = await connectHttp(server.url, SELF_OP);
    const ctx = await newContext({ viewport: { width: 1280, height: 800 } });
    try {
      const asked = await self.client.callTool({
        name: "run_benchmark",
        arguments: { ...BENCH, batch_sizes: [3] },
      });
      const id = errorOf(asked)!.details.approval_id as string;
      const p = await ctx.newPage();
      await signIn(p, SELF_OP);
      const card = p.locator(`article.approval[data-id="${id}"]`);
      await card.waitFor();
      expect(await card.innerText()).toContain("self-approval is refused");
      expect(await card.locator("button.approve").isDisabled()).toBe(true);
      // Around the page: a same-origin API call with a valid CSRF token is refused too.
      const session = await (await p.request.get(`${base}/console/api/session`)).json();
      const r = await p.request.post(`${base}/console/api/approvals/${id}/approve`, {
        headers: { "x-csrf-token": session.csrf, "content-type": "application/json" },
        data: {},
      });
      expect(r.status()).toBe(403);
      expect((await r.json()).error.code).toBe("approval_self_grant");
      // The operator (another identity) still sees it pending.
      await page.locator(`article.approval[data-id="${id}"]`).waitFor();
    } finally {
      await ctx.close();
      await self.close();
    }
  });

  it("refuses a cross-site form POST and a POST without the CSRF token", async () => {
    const pending = (await (await page.request.get(`${base}/console/api/approvals`)).json())
      .pending as { id: string }[];
    const id = pending[0].id;
    const target = `${base}/console/api/approvals/${id}/approve`;
    // Another site (localhost ≠ 127.0.0.1) posts a form at the console in the operator's browser.
    const evil = await serve("localhost", {
      "/": {
        type: "text/html",
        body: `<form id="f" method="POST" action="${target}" enctype="text/plain"><input name='{"a":"' value='"}'></form><script>document.getElementById("f").submit()</script>`,
      },
    });
    const attack = await operator.newPage();
    const answer = attack.waitForResponse((r) => r.url() === target);
    await attack.goto(`${evil}/`);
    const refused = await answer;
    // The first layer to answer is the HTTP server's Origin check (test/e2e/console_api.test.ts
    // tries each layer alone); the browser also left the SameSite=Strict cookie at home.
    expect(refused.status()).toBe(403);
    expect(JSON.parse((await refused.body()).toString("utf8")).error).toMatchObject({
      code: -32000,
      message: expect.stringMatching(/^Origin not allowed/),
    });
    const sent = await refused.request().allHeaders();
    expect(sent.origin).toBe(evil);
    expect(sent.cookie ?? "").not.toContain("tpu_console=");
    await attack.close();
    // Same origin with the session cookie but no CSRF token: refused.
    const noCsrf = await page.request.post(target, {
      headers: { "content-type": "application/json" },
      data: {},
    });
    expect(noCsrf.status()).toBe(403);
    expect((await noCsrf.json()).error.code).toBe("csrf");
    const after = await (await page.request.get(`${base}/console/api/approvals`)).json();
    expect(after.pending.map((a: { id: string }) => a.id)).toContain(id);
  });

  it("shows the audit with filters and the chain's state, jobs and the runtime", async () => {
    await page.goto(`${base}/console/#/activity`);
    await page.waitForSelector("#audit table");
    expect(await page.textContent("#audit .status")).toMatch(/Chain intact: \d+ record/);
    await page.selectOption("#f-outcome", "approval_denied");
    await page.click(".filters button[type=submit]");
    await expect
      .poll(async () => {
        const rows = await page.locator("#audit tbody tr").allInnerTexts();
        return rows.length > 0 && rows.every((r) => r.includes("approval_denied"));
      })
      .toBe(true);
    await page.screenshot({ path: join(SHOTS, "console-activity.png") });

    const loaded = await agent.client.callTool({
      name: "load_model",
      arguments: { model: "mnist-cnn" },
    });
    expect(loaded.isError).toBeFalsy();
    // The runtime page runs get_runtime_status through the gate: this operator lacks models:read.
    await page.goto(`${base}/console/#/runtime`);
    await expect.poll(() => page.textContent("#runtime")).toContain("needs the models:read scope");

    await page.goto(`${base}/console/#/jobs`);
    await page.waitForSelector("#jobs");
    expect(await page.locator("#jobs button", { hasText: "Cancel" }).count()).toBe(0); // not admin
  });

  it("lets an admin cancel anyone's running job from the Jobs page", async () => {
    const admin = await connectHttp(server.url, ADMIN);
    const ctx = await newContext({ viewport: { width: 1280, height: 800 } });
    try {
      const job = await admin.client.callTool({
        name: "run_benchmark",
        arguments: {
          model: "mnist-cnn",
          batch_sizes: [1],
          duration_s: 120,
          warmup: 0,
          wait: false,
        },
      });
      const jobId = (job.structuredContent as any).job_id as string;
      expect(jobId).toMatch(/^job_/);
      const p = await ctx.newPage();
      await signIn(p, ADMIN);
      await p.goto(`${base}/console/#/runtime`);
      await p.waitForSelector("#runtime dl");
      expect(await p.textContent("#runtime")).toContain("ready");
      expect(await p.textContent("#runtime")).toMatch(/Devices \(1\)/);
      const models = p.locator("table", { hasText: "queue_depth" });
      expect(await models.innerText()).toContain("mnist-cnn");
      await p.screenshot({ path: join(SHOTS, "console-runtime.png") });
      await p.goto(`${base}/console/#/jobs`);
      const row = p.locator("#jobs tr", { hasText: jobId });
      await row.locator("button", { hasText: "Cancel" }).click();
      await expect.poll(() => row.innerText(), { timeout: scaled(60_000) }).toMatch(/cancelled/);
      await p.screenshot({ path: join(SHOTS, "console-jobs.png") });
    } finally {
      await ctx.close();
      await admin.close();
    }
  });

  it("draws a real report's series, compares two reports, and shows values on hover", async () => {
    const admin = await connectHttp(server.url, ADMIN);
    let second = "";
    try {
      const r = await admin.client.callTool({
        name: "run_benchmark",
        arguments: { ...BENCH, dtypes: ["float32", "bfloat16"], batch_sizes: [1, 4, 8] },
      });
      expect(r.isError).toBeFalsy();
      second = (r.structuredContent as any).report_id;
    } finally {
      await admin.close();
    }
    await page.goto(`${base}/console/#/benchmarks`);
    await page.waitForSelector("#charts canvas");
    await page.selectOption("#report-a", approvedReport);
    await expect
      .poll(async () => JSON.parse((await page.getAttribute("#charts", "data-series")) ?? "[]"))
      .toEqual(["float32 eager"]);
    expect(Number(await page.getAttribute("#charts", "data-points"))).toBe(4);
    expect(await page.locator("#charts canvas").count()).toBe(2);
    const rows = await page.locator("#report-table tbody tr").count();
    expect(rows).toBe(4);
    // Measured on a (simulated) loaded host: every point ringed, every row saying why, and each
    // p50 drawn with its interval.
    expect(await page.getAttribute("#charts", "data-unstable")).toBe("4");
    expect(await page.getAttribute("#charts", "data-intervals")).toBe("4");
    const verdicts = await page
      .locator("#report-table tbody tr.unstable td:last-child")
      .allInnerTexts();
    expect(verdicts).toHaveLength(4);
    for (const v of verdicts) expect(v).toMatch(LOADED);

    await page.selectOption("#report-b", second);
    await expect
      .poll(async () => JSON.parse((await page.getAttribute("#charts", "data-series")) ?? "[]"))
      .toEqual(["float32 eager", "bfloat16 eager"]);
    expect(Number(await page.getAttribute("#charts", "data-points"))).toBe(4 + 6);
    // A against B: each matching configuration's p50 difference with its interval and verdict.
    const diffs = page.locator("#report-table table.comparison tbody tr");
    await expect.poll(() => diffs.count()).toBe(3);
    for (const d of await diffs.evaluateAll((trs) =>
      trs.map((t) => (t as HTMLElement).dataset.difference),
    ))
      expect(["no significant difference", "slower", "faster"]).toContain(d);
    expect(await diffs.first().locator("td").nth(2).innerText()).toMatch(/^\d+\.\d{3}–\d+\.\d{3}$/);

    // Hover the latency chart: the legend shows the values under the cursor.
    const over = page.locator(".chart-latency .u-over");
    const box = (await over.boundingBox())!;
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.5);
    await expect
      .poll(() => page.locator(".chart-latency .u-legend .u-value").allInnerTexts())
      .toContainEqual(expect.stringMatching(/^\d+(\.\d+)? ms \(CI [\d.]+–[\d.]+\) unstable$/));
    await page.screenshot({ path: join(SHOTS, "console-benchmarks.png"), fullPage: true });
  });

  it("works at phone width and from the keyboard", async () => {
    const phone = await newContext({
      viewport: { width: 390, height: 844 },
      deviceScaleFactor: 1,
    });
    try {
      const p = await phone.newPage();
      const asked = await agent.client.callTool({
        name: "run_benchmark",
        arguments: { ...BENCH, batch_sizes: [5] },
      });
      const id = errorOf(asked)!.details.approval_id as string;
      await signIn(p, OPERATOR);
      await p.locator(`article.approval[data-id="${id}"]`).waitFor();
      const overflow = await p.evaluate(
        () => document.documentElement.scrollWidth - document.documentElement.clientWidth,
      );
      expect(overflow).toBeLessThanOrEqual(0);
      await p.screenshot({ path: join(SHOTS, "console-phone.png") });

      // Keyboard only: Tab reaches the page links and the decision buttons; Enter approves.
      await p.reload();
      await p.locator(`article.approval[data-id="${id}"]`).waitFor();
      const reached: string[] = [];
      // Pending cards are listed soonest to expire first: Tab on to this request's own button.
      for (let i = 0; i < 80; i++) {
        await p.keyboard.press("Tab");
        const t = await p.evaluate((want) => {
          const a = document.activeElement as HTMLElement | null;
          const card = a?.closest("article.approval") as HTMLElement | null;
          const other = card && card.dataset.id !== want ? " (another request)" : "";
          return `${a?.tagName}:${a?.textContent?.trim() ?? ""}${other}`;
        }, id);
        reached.push(t);
        if (t === "BUTTON:Approve") break;
      }
      expect(reached, reached.join(" | ")).toContain("A:Benchmarks");
      expect(reached.at(-1)).toBe("BUTTON:Approve");
      await p.keyboard.press("Enter");
      await p.locator(`article.approval[data-id="${id}"]`).waitFor({ state: "detached" });
    } finally {
      await phone.close();
    }
  });

  it("renders the MCP App view from a real run_benchmark result in a sandboxed iframe under the default CSP", async () => {
    const caps = { extensions: { "io.modelcontextprotocol/ui": { mimeTypes: [UI_MIME] } } };
    const admin = await connectHttp(server.url, ADMIN, { capabilities: caps as any });
    const withUi = await connectHttp(server.url, AGENT, { capabilities: caps as any });
    try {
      const tools = (await admin.client.listTools()).tools;
      const bench = tools.find((t) => t.name === "run_benchmark")!;
      const uri = (bench._meta as any)?.ui?.resourceUri as string;
      expect(uri).toBe("ui://tpu-mcp/benchmark-view.html");
      const res = await admin.client.readResource({ uri });
      const html = (res.contents[0] as any).text as string;
      expect(res.contents[0].mimeType).toBe(UI_MIME);
      expect(html).not.toMatch(/<script[^>]+src=|<link[^>]+href=|https?:\/\//i);
      const result = await admin.client.callTool({ name: "run_benchmark", arguments: BENCH });
      expect(result.isError).toBeFalsy();
      // get_job for a finished benchmark links the same view and is drawn the same way.
      expect((tools.find((t) => t.name === "get_job")?._meta as any)?.ui?.resourceUri).toBe(uri);
      const started = await admin.client.callTool({
        name: "run_benchmark",
        arguments: { ...BENCH, batch_sizes: [1, 2], wait: false },
      });
      const jobId = (started.structuredContent as any).job_id as string;
      let job: any;
      await expect
        .poll(
          async () => {
            job = await admin.client.callTool({ name: "get_job", arguments: { job_id: jobId } });
            return (job.structuredContent as any).status;
          },
          { timeout: scaled(90_000), interval: 500 },
        )
        .toBe("succeeded");
      const approval = await withUi.client.callTool({
        name: "run_benchmark",
        arguments: { ...BENCH, batch_sizes: [7] },
      });
      expect((approval._meta as any)?.ui?.resourceUri).toBe("ui://tpu-mcp/approval-card.html");

      // A minimal host: sandboxed iframe (scripts only, opaque origin) served with the default
      // CSP; it answers ui/initialize and then sends the tool input and result.
      const hostJs = `
        const results = ${JSON.stringify({ report: result, job, approval })};
        for (const [name, result] of Object.entries(results)) {
          const f = document.createElement("iframe");
          f.id = name; f.setAttribute("sandbox", "allow-scripts"); f.src = "/view";
          f.style.width = "900px"; f.style.height = name === "approval" ? "420px" : "900px";
          document.body.append(f);
          window.addEventListener("message", (e) => {
            if (e.source !== f.contentWindow) return;
            const m = e.data;
            if (m.method === "ui/initialize")
              f.contentWindow.postMessage({ jsonrpc: "2.0", id: m.id, result: {
                protocolVersion: "2026-01-26", hostInfo: { name: "test-host", version: "0" },
                hostCapabilities: {}, hostContext: { theme: "light", displayMode: "inline" } } }, "*");
            if (m.method === "ui/notifications/initialized") {
              f.contentWindow.postMessage({ jsonrpc: "2.0", method: "ui/notifications/tool-input",
                params: { arguments: ${JSON.stringify(BENCH)} } }, "*");
              f.contentWindow.postMessage({ jsonrpc: "2.0", method: "ui/notifications/tool-result",
                params: result }, "*");
            }
            if (m.method === "ui/notifications/size-changed") f.dataset.size = JSON.stringify(m.params);
          });
        }`;
      const host = await serve("127.0.0.1", {
        "/": {
          type: "text/html",
          body: `<!doctype html><body style="margin:0"><script src="/host.js"></script></body>`,
        },
        "/host.js": { type: "text/javascript", body: hostJs },
        "/view": {
          type: "text/html",
          body: html,
          headers: { "content-security-policy": APPS_DEFAULT_CSP },
        },
      });
      const ctx = await newContext({ viewport: { width: 920, height: 2300 } });
      try {
        const p = await ctx.newPage();
        const violations: string[] = [];
        p.on("console", (m) => {
          if (/Content Security Policy|Refused to/i.test(m.text())) violations.push(m.text());
        });
        await p.goto(`${host}/`);
        const view = p.frameLocator("#report");
        await view.locator("#charts canvas").first().waitFor();
        expect(await view.locator("#charts canvas").count()).toBe(2);
        expect(await view.locator("#charts").getAttribute("data-series")).toBe(
          JSON.stringify(["float32 eager"]),
        );
        expect(await view.locator("#charts").getAttribute("data-points")).toBe("4");
        expect(await view.locator("#charts").getAttribute("data-unstable")).toBe("4");
        expect(await view.locator("#charts").getAttribute("data-intervals")).toBe("4");
        const notes = await view.locator("ul.unstable li").allInnerTexts();
        expect(notes).toHaveLength(4);
        for (const n of notes) expect(n.replace(/^.*?: (?=unstable)/, "")).toMatch(LOADED);
        expect(await view.locator("tbody tr.unstable").count()).toBe(4);
        expect(await view.locator("h1").innerText()).toContain("mnist-cnn");
        const fromJob = p.frameLocator("#job");
        await fromJob.locator("#charts canvas").first().waitFor();
        expect(await fromJob.locator("#charts").getAttribute("data-points")).toBe("2");
        const card = p.frameLocator("#approval");
        await card.locator("h1", { hasText: "Waiting for an operator's approval" }).waitFor();
        expect(await card.locator("dl").innerText()).toContain("run_benchmark");
        expect(await card.locator("main").innerText()).toContain("cannot approve anything");
        // The card names the console's page for this approval and the command for any folder.
        expect(await card.locator("main").innerText()).toMatch(
          /console \(http:\S+#\/approvals\/apr_\w+\) or with `node \/\S+\/bin\/tpu-mcp\.js approvals approve apr_\w+/,
        );
        await expect.poll(() => p.getAttribute("#report", "data-size")).toBeTruthy();
        expect(violations).toEqual([]);
        await p.locator("#report").screenshot({ path: join(SHOTS, "mcp-app.png") });
        await p.locator("#approval").screenshot({ path: join(SHOTS, "mcp-app-approval.png") });
      } finally {
        await ctx.close();
      }
    } finally {
      await admin.close();
      await withUi.close();
    }
  });

  it("offers no MCP App metadata to a client without the extension", async () => {
    const tools = (await agent.client.listTools()).tools;
    expect(tools.find((t) => t.name === "run_benchmark")?._meta).toBeUndefined();
    const r = await agent.client.callTool({
      name: "run_benchmark",
      arguments: { ...BENCH, batch_sizes: [6] },
    });
    expect(errorOf(r)?.code).toBe("approval_required");
    expect((r._meta as any)?.ui).toBeUndefined();
    expect((r.content as any)[0].text).toContain(errorOf(r)?.details?.approve_command as string);
    expect(errorOf(r)?.details?.approve_command).toMatch(/^node \/\S+\/bin\/tpu-mcp\.js approvals/);
  });
});

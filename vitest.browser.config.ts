import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// `npm run test:browser`: the operator console and the MCP App view in Debian's chromium,
// driven by playwright-core, against a real server and worker.
export default defineConfig({
  test: {
    include: ["test/browser/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts", "test/browser/setup.ts"],
    testTimeout: scaled(120_000),
    hookTimeout: scaled(180_000),
    fileParallelism: false,
    pool: "forks",
    // In CI (CI=true) a failed test runs once more: real workers on a shared 2-core VM make a few
    // timing-bound steps flaky. A test that fails twice fails the run; a retried one shows in the
    // log (docs/development.md).
    retry: process.env.CI ? 1 : 0,
  },
});

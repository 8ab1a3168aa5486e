import { defineConfig } from "vitest/config";

// `npm run test:browser`: the operator console and the MCP App view in Debian's chromium,
// driven by playwright-core, against a real server and worker.
export default defineConfig({
  test: {
    include: ["test/browser/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts", "test/browser/setup.ts"],
    testTimeout: 120_000,
    hookTimeout: 180_000,
    fileParallelism: false,
    pool: "forks",
  },
});

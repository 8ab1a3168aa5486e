import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// The Ray fleet end to end (test/ray): a real local Ray cluster with token auth, simulated TPU
// hosts, a real server and MCP client. Only inside the loopback-only network namespace that
// `npm run test:ray` (scripts/test-ray.sh) makes.
export default defineConfig({
  test: {
    include: ["test/ray/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts"],
    testTimeout: scaled(300_000),
    hookTimeout: scaled(300_000),
    fileParallelism: false,
    pool: "forks",
    // In CI (CI=true) a failed test runs once more: real workers on a shared 2-core VM make a few
    // timing-bound steps flaky. A test that fails twice fails the run; a retried one shows in the
    // log (docs/development.md).
    retry: process.env.CI ? 1 : 0,
  },
});

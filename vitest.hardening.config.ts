import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// The hardening suites (test/hardening): faults, bad input, access, load and protocol
// conformance against real servers and workers. Long (minutes), so `npm test` leaves them out;
// `npm run test:hardening` runs them one file at a time.
export default defineConfig({
  test: {
    include: ["test/hardening/**/*.test.ts"],
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

import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// The shared store on a real PostgreSQL (test/postgres): each file starts its own cluster in a
// temporary folder on 127.0.0.1 (test/helpers/postgres.ts; Debian's `postgresql` package, which
// `npm run test:postgres` installs when missing), so files run one after another.
export default defineConfig({
  test: {
    include: ["test/postgres/**/*.test.ts"],
    globalSetup: ["test/postgres/setup.ts"],
    testTimeout: scaled(60_000),
    hookTimeout: scaled(120_000),
    fileParallelism: false,
    pool: "forks",
    // As in the other suites: in CI a failed test runs once more (shared 2-core VM).
    retry: process.env.CI ? 1 : 0,
  },
});

import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

const filesAtOnce = process.env.TPU_MCP_TEST_FILES ?? "1";
if (!/^[1-9][0-9]*$/.test(filesAtOnce))
  throw new Error(
    `TPU_MCP_TEST_FILES is how many test files run at once: a whole number from 1 (the default), not "${filesAtOnce}"`,
  );
const FILES_AT_ONCE = Number(filesAtOnce);

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The long hardening suites run with `npm run test:hardening` (vitest.hardening.config.ts),
    // the browser suite with `npm run test:browser` (vitest.browser.config.ts); test/ray needs a
    // loopback-only network namespace: `npm run test:ray` (vitest.ray.config.ts); test/tpu_sim
    // needs the simulated TPU host: `npm run test:tpu-sim` (vitest.tpu-sim.config.ts); test/vllm
    // needs vLLM's own environment: `npm run test:vllm` (vitest.vllm.config.ts); test/package
    // packs and installs the npm package: `npm run test:package` (vitest.package.config.ts); test/postgres
    // starts real PostgreSQL clusters: `npm run test:postgres` (vitest.postgres.config.ts).
    exclude: [
      "**/node_modules/**",
      "test/hardening/**",
      "test/browser/**",
      "test/ray/**",
      "test/tpu_sim/**",
      "test/vllm/**",
      "test/package/**",
      "test/postgres/**",
    ],
    // Creates the built-in model files once (a no-op when they exist).
    globalSetup: ["test/globalSetup.ts"],
    // As a quiet machine needs them, times this machine's measured slowdown (test/helpers/calibrate.ts).
    testTimeout: scaled(60_000),
    hookTimeout: scaled(120_000),
    // Tests spawn real Python workers with torch; two cores cannot run many at once. One file at
    // a time unless TPU_MCP_TEST_FILES says more (2 lets a second file use the core the first
    // leaves idle while it waits on its server and worker; not yet the default: a full run beside
    // four CPU burners at 2 has not been measured, docs/development.md#where-the-time-goes).
    fileParallelism: FILES_AT_ONCE > 1,
    maxWorkers: FILES_AT_ONCE,
    pool: "forks",
    // In CI (CI=true) a failed test runs once more: real workers on a shared 2-core VM make a few
    // timing-bound steps flaky. A test that fails twice fails the run; a retried one shows in the
    // log (docs/development.md).
    retry: process.env.CI ? 1 : 0,
  },
});

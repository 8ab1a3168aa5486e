import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

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
    // Tests spawn real Python workers with torch; two cores cannot run many at once.
    fileParallelism: false,
    pool: "forks",
    // In CI (CI=true) a failed test runs once more: real workers on a shared 2-core VM make a few
    // timing-bound steps flaky. A test that fails twice fails the run; a retried one shows in the
    // log (docs/development.md).
    retry: process.env.CI ? 1 : 0,
  },
});

import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// The simulated-TPU suite (`npm run test:tpu-sim`): needs .venv-tpu (created on first use).
export default defineConfig({
  test: {
    include: ["test/tpu_sim/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts"],
    testTimeout: scaled(600_000),
    hookTimeout: scaled(600_000),
    fileParallelism: false,
    pool: "forks",
    // In CI (CI=true) a failed test runs once more: real workers on a shared 2-core VM make a few
    // timing-bound steps flaky. A test that fails twice fails the run; a retried one shows in the
    // log (docs/development.md).
    retry: process.env.CI ? 1 : 0,
  },
});

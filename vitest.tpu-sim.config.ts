import { defineConfig } from "vitest/config";

// The simulated-TPU suite (`npm run test:tpu-sim`): needs .venv-tpu (created on first use).
export default defineConfig({
  test: {
    include: ["test/tpu_sim/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts"],
    testTimeout: 600_000,
    hookTimeout: 600_000,
    fileParallelism: false,
    pool: "forks",
  },
});

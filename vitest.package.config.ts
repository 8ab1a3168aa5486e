import { defineConfig } from "vitest/config";
import { scaled } from "./test/helpers/calibrate.js";

// tpu-mcp as an installed package (test/package): `npm pack`, the tarball installed into a
// temporary prefix with a fresh HOME, the bin started as a desktop host starts it, its set-up, a
// real chat over stdio and HTTP; the Claude Desktop bundle and the MCP Registry entry validated
// with their own tools and schemas. `npm run test:package`; minutes (better-sqlite3 compiles).
export default defineConfig({
  test: {
    include: ["test/package/**/*.test.ts"],
    globalSetup: ["test/globalSetup.ts"],
    testTimeout: scaled(300_000),
    hookTimeout: scaled(1_200_000),
    fileParallelism: false,
    pool: "forks",
    retry: process.env.CI ? 1 : 0,
  },
});

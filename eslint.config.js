import tseslint from "typescript-eslint";

export default tseslint.config(
  {
    ignores: [
      "node_modules/",
      ".venv/",
      ".venv-tpu/",
      ".venv-vllm/",
      ".data/",
      "coverage/",
      "dist/",
      "runtime/worker/",
    ],
  },
  ...tseslint.configs.recommended,
  {
    rules: {
      // stdout is the MCP protocol channel under stdio: log through pino to stderr.
      "no-console": "error",
      "@typescript-eslint/no-explicit-any": "off",
      // A leading underscore marks a value deliberately unused (e.g. a field dropped by destructuring).
      "@typescript-eslint/no-unused-vars": [
        "error",
        { argsIgnorePattern: "^_", varsIgnorePattern: "^_", destructuredArrayIgnorePattern: "^_" },
      ],
    },
  },
  {
    // The storage port is asynchronous: a promise nobody awaits or catches is a lost write or an
    // unhandled rejection (which ends the process), and one given where a plain value is expected
    // is always truthy.
    files: [
      "server/**/*.ts",
      "tools/**/*.ts",
      "policies/**/*.ts",
      "runtime/**/*.ts",
      "lib/**/*.ts",
    ],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/await-thenable": "error",
    },
  },
  {
    files: ["test/**", "bench/**", "scripts/**"],
    rules: { "no-console": "off" },
  },
);

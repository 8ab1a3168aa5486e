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
    files: ["test/**", "bench/**", "scripts/**"],
    rules: { "no-console": "off" },
  },
);

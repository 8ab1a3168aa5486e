import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", ".venv/", ".data/", "coverage/", "runtime/worker/"] },
  ...tseslint.configs.recommended,
  {
    rules: {
      // stdout is the MCP protocol channel under stdio: log through pino to stderr.
      "no-console": "error",
      "@typescript-eslint/no-explicit-any": "off",
    },
  },
  {
    files: ["test/**", "bench/**", "scripts/**"],
    rules: { "no-console": "off" },
  },
);

import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  hashToken,
  parsePolicyConfig,
  policyConfigSchema,
  toolConcurrency,
  toolQueueBound,
  toolTimeoutMs,
} from "../../policies/config.js";
import { AUTH_ERROR_CODES, PolicyError } from "../../policies/errors.js";
import { TOOL_POLICIES } from "../../tools/registry.js";

describe("policy config", () => {
  it("accepts {} and fills sensible defaults", () => {
    const c = parsePolicyConfig({}, TOOL_POLICIES);
    expect(c.stdio_principal).toEqual({
      id: "local-user",
      scopes: [
        "models:read",
        "models:load",
        "models:unload",
        "inference:run",
        "benchmark:run",
        "jobs:read",
      ],
    });
    expect(c.tokens).toEqual([]);
    expect(c.jwt).toBeUndefined();
    expect(toolConcurrency(c.limits, "run_inference")).toBe(32);
    expect(toolConcurrency(c.limits, "load_model")).toBe(1);
    expect(toolConcurrency(c.limits, "run_benchmark")).toBe(1);
    expect(toolConcurrency(c.limits, "list_models")).toBe(8);
    expect(toolQueueBound(c.limits, "run_inference")).toBe(16);
    // A set (tools/list order); the tools' own records are its source.
    expect([...c.limits.device_exclusive_tools].sort()).toEqual([
      "check_model",
      "load_model",
      "run_benchmark",
      "unload_model",
    ]);
    expect(c.limits.device_shared_tools).toEqual(["run_inference"]);
    expect(toolTimeoutMs(c.limits, "run_inference")).toBe(120_000);
    expect(toolTimeoutMs(c.limits, "load_model")).toBe(900_000);
    expect(toolTimeoutMs(c.limits, "check_model")).toBe(300_000);
    expect(toolTimeoutMs(c.limits, "list_models")).toBe(60_000);
    expect(c.limits.rate_limit.per_principal_per_minute).toBe(120);
    expect(c.limits.budget).toEqual({
      read_device_seconds_per_window: 30,
      device_seconds_per_window: 3600,
      window_s: 3600,
    });
    // Secure by default: costly work asks a human unless the config says otherwise.
    expect(c.approvals).toEqual({
      rules: [
        { tool: "run_benchmark", assurance: "token" },
        { tool: "load_model", when: { min_weight_bytes: 2 ** 30 }, assurance: "token" },
        { tool: "check_model", when: { min_device_seconds: 30 }, assurance: "token" },
      ],
      notify: [],
      ttl_s: 900,
      max_pending_per_principal: 20,
      keep_decided_s: 604_800,
      elicitation: true,
      elicitation_timeout_s: 300,
      overrun_factor: 2,
      overrun_min_s: 30,
    });
    expect(c.audit.redact_args).toEqual(["texts", "messages", "tensors"]);
  });

  it("checks approval webhooks: an http(s) URL, a secret file, known events", () => {
    const c = parsePolicyConfig(
      {
        approvals: { notify: [{ url: "https://hooks.example.com/x", secret_file: "s" }] },
      },
      TOOL_POLICIES,
    );
    expect(c.approvals.notify).toEqual([
      { url: "https://hooks.example.com/x", secret_file: "s", events: ["requested", "decided"] },
    ]);
    const bad = (n: unknown) => () =>
      parsePolicyConfig({ approvals: { notify: [n] } }, TOOL_POLICIES);
    expect(bad({ url: "ftp://x/y", secret_file: "s" })).toThrow(/http:\/\/ or https:\/\//);
    expect(bad({ url: "https://x/y" })).toThrow(/secret_file/);
    expect(bad({ url: "https://x/y", secret_file: "s", events: ["used"] })).toThrow(/events/);
    expect(bad({ url: "https://x/y", secret_file: "s", secret: "inline" })).toThrow();
  });

  it("keeps default concurrency for tools a partial record does not name", () => {
    const c = parsePolicyConfig(
      {
        limits: { per_tool_concurrency: { load_model: 2 }, call_timeout_s: { get_job: 5 } },
      },
      TOOL_POLICIES,
    );
    expect(toolConcurrency(c.limits, "load_model")).toBe(2);
    expect(toolConcurrency(c.limits, "run_inference")).toBe(32);
    expect(toolTimeoutMs(c.limits, "get_job")).toBe(5000);
    expect(toolTimeoutMs(c.limits, "run_benchmark")).toBe(1_800_000);
  });

  it("rejects a rule for an unknown tool, so a typo cannot switch an approval off", () => {
    const r = policyConfigSchema(TOOL_POLICIES).safeParse({
      approvals: { rules: [{ tool: "lod_model" }] },
    });
    expect(r.success).toBe(false);
    expect(r.error!.issues[0]!.path).toEqual(["approvals", "rules", 0, "tool"]);
  });

  it("rejects plaintext tokens, unknown scopes and duplicate hashes", () => {
    expect(
      policyConfigSchema(TOOL_POLICIES).safeParse({
        tokens: [{ id: "a", token_sha256: "secret", scopes: [] }],
      }).success,
    ).toBe(false);
    expect(
      policyConfigSchema(TOOL_POLICIES).safeParse({
        tokens: [{ id: "a", token_sha256: hashToken("x"), scopes: ["root"] }],
      }).success,
    ).toBe(false);
    const dup = { token_sha256: hashToken("x"), scopes: ["models:read"] };
    expect(
      policyConfigSchema(TOOL_POLICIES).safeParse({
        tokens: [
          { id: "a", ...dup },
          { id: "b", ...dup },
        ],
      }).success,
    ).toBe(false);
  });

  it("needs exactly one JWKS source", () => {
    const base = { issuer: "https://issuer", audience: "tpu-mcp" };
    expect(policyConfigSchema(TOOL_POLICIES).safeParse({ jwt: base }).success).toBe(false);
    expect(
      policyConfigSchema(TOOL_POLICIES).safeParse({
        jwt: { ...base, jwks_url: "https://issuer/jwks" },
      }).success,
    ).toBe(true);
    expect(
      policyConfigSchema(TOOL_POLICIES).safeParse({
        jwt: { ...base, jwks_url: "https://issuer/jwks", jwks: { keys: [{ kty: "EC" }] } },
      }).success,
    ).toBe(false);
  });

  it("hashes tokens as sha256 hex", () => {
    expect(hashToken("abc")).toBe(
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    );
  });

  it("parses the demo config, whose hashes match the demo tokens", () => {
    const file = JSON.parse(
      readFileSync(new URL("../../examples/policy.demo.json", import.meta.url), "utf8"),
    );
    const c = parsePolicyConfig(file.policy, TOOL_POLICIES);
    const byId = Object.fromEntries(c.tokens.map((t) => [t.id, t]));
    expect(byId.agent!.token_sha256).toBe(hashToken("demo-agent-token"));
    expect(byId.reader!.token_sha256).toBe(hashToken("demo-reader-token"));
    expect(byId.operator!.token_sha256).toBe(hashToken("demo-operator-token"));
    expect(byId.reader!.scopes).toEqual(["models:read"]);
    expect(byId.operator!.scopes).toEqual(["approvals:grant"]);
    expect(c.approvals.elicitation).toBe(false);
  });
});

describe("error catalogue", () => {
  it("documents every auth code in one line", () => {
    for (const [code, doc] of Object.entries(AUTH_ERROR_CODES)) {
      expect(code).toMatch(/^[a-z_]+$/);
      expect(doc.length).toBeGreaterThan(10);
      expect(doc).not.toContain("\n");
    }
  });

  it("carries code, message and details", () => {
    const e = new PolicyError("busy", "retry later", { retry_after_ms: 5 });
    expect(e).toBeInstanceOf(Error);
    expect(e.toJSON()).toEqual({
      code: "busy",
      message: "retry later",
      details: { retry_after_ms: 5 },
    });
  });
});

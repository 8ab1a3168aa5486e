// The MCP Registry entry: server.json is what scripts/server_json.ts makes from package.json and
// the tool registry, it validates against the registry's 2025-12-11 schema, and the package's
// mcpName names it. The schema is vendored (test/package/vendor/): a copy of the registry's
// internal/validators/schemas/2025-12-11.json (modelcontextprotocol/registry @ e361b5f), whose
// $id is the published https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv } from "ajv";
import { describe, expect, it } from "vitest";
import { SCHEMA_URL, SERVER_JSON, imageName, serverJson } from "../../scripts/server_json.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { ROOT } from "../helpers/server.js";

const schema = JSON.parse(
  readFileSync(join(ROOT, "test/package/vendor/server.schema.2025-12-11.json"), "utf8"),
);
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));

function validator() {
  const ajv = new Ajv({ allErrors: true, strict: false });
  // The schema's one format; a URL the WHATWG parser takes.
  ajv.addFormat("uri", (s: string) => URL.canParse(s));
  return ajv.compile(schema);
}

const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v));

describe("server.json (MCP Registry, schema 2025-12-11)", () => {
  const validate = validator();
  const committed = JSON.parse(readFileSync(SERVER_JSON, "utf8"));

  it("is the vendored schema of that date", () => {
    expect(schema.$id).toBe(SCHEMA_URL);
    expect(committed.$schema).toBe(SCHEMA_URL);
  });

  it("is what the generator makes from package.json and the tool registry", () => {
    expect(committed).toEqual(serverJson());
    expect(committed.version).toBe(pkg.version);
    expect(committed._meta["io.modelcontextprotocol.registry/publisher-provided"].tools).toEqual(
      TOOL_POLICIES.map((p) => p.name),
    );
  });

  it("validates, with the npm package and the OCI image as its packages", () => {
    expect(validate(committed), JSON.stringify(validate.errors, null, 1)).toBe(true);
    const [npm, oci] = committed.packages;
    expect(npm).toMatchObject({
      registryType: "npm",
      identifier: pkg.name,
      version: pkg.version,
      transport: { type: "stdio" },
    });
    expect(oci).toMatchObject({
      registryType: "oci",
      identifier: imageName(pkg.version),
      transport: { type: "streamable-http" },
    });
    expect(npm.environmentVariables.map((e: { name: string }) => e.name)).toContain("TPU_MCP_HOME");
  });

  it("is named by the package's mcpName (the registry's proof of npm ownership)", () => {
    expect(pkg.mcpName).toBe(committed.name);
  });

  it("fails validation when one field breaks", () => {
    for (const [what, breakIt] of [
      ["a name without its namespace", (s: any) => (s.name = "tpu-mcp")],
      ["a description over 100 characters", (s: any) => (s.description = "x".repeat(101))],
      ["a package version 'latest'", (s: any) => (s.packages[0].version = "latest")],
      ["a package without a transport", (s: any) => delete s.packages[1].transport],
      ["no version", (s: any) => delete s.version],
    ] as const) {
      const broken = clone(committed);
      breakIt(broken);
      expect(validate(broken), what).toBe(false);
    }
  });
});

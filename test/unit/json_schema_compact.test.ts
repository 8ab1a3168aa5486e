// What tools/list publishes of a zod schema is smaller than zod's JSON Schema and says the same to a
// validator: a free-form nested object is `{type: "object"}`, a union's branches do not repeat the
// root's type, and a nested output object is bare (with its own note, never its field names).
import { Ajv2020 } from "ajv/dist/2020.js";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { jsonSchema } from "../../server/mcp/json_schema.js";

describe("published input schemas", () => {
  const input = z
    .object({
      format: z.object({ schema: z.looseObject({}), properties: z.string().optional() }).strict(),
    })
    .strict();
  const s = jsonSchema(input, "input") as any;

  it("publishes a free-form nested object as {type: object}", () => {
    expect(s.properties.format.properties.schema).toEqual({ type: "object" });
  });

  it("keeps an argument named `properties`, and the root's properties", () => {
    expect(s.properties.format.properties.properties).toEqual({ type: "string" });
    expect(jsonSchema(z.object({}).strict(), "input")).toEqual({ type: "object", properties: {} });
  });

  it("still accepts any object there, and refuses a non-object", () => {
    const validate = new Ajv2020({ strict: true }).compile(s);
    expect(validate({ format: { schema: { type: "object", anything: [1] } } })).toBe(true);
    expect(validate({ format: { schema: "text" } })).toBe(false);
  });
});

describe("published output schemas", () => {
  const Job = z.object({ job_id: z.string() });
  const Result = z.object({
    rows: z.array(z.object({ secret_field_name: z.number() })),
    stats: z.object({ inner_field_name: z.number() }).describe("what the stats say"),
  });
  const s = jsonSchema(z.union([Result, Job]), "output") as any;

  it("states the object once, at the root of a union", () => {
    expect(s.type).toBe("object");
    for (const b of s.anyOf) expect(b).not.toHaveProperty("type");
  });

  it("publishes nested objects bare, with their own note and no field names", () => {
    const [result] = s.anyOf;
    expect(result.properties.rows).toEqual({ type: "array" });
    expect(result.properties.stats).toEqual({ type: "object", description: "what the stats say" });
    expect(JSON.stringify(s)).not.toMatch(/secret_field_name|inner_field_name/);
  });

  it("validates both shapes of the answer and refuses a wrong type", () => {
    const validate = new Ajv2020({ strict: true }).compile(s);
    expect(validate({ rows: [{ secret_field_name: 1 }], stats: { inner_field_name: 2 } })).toBe(
      true,
    );
    expect(validate({ job_id: "job_1" })).toBe(true);
    expect(validate("not an object")).toBe(false);
    const one = new Ajv2020({ strict: true }).compile(jsonSchema(Result, "output"));
    expect(one({ rows: "not a list", stats: {} })).toBe(false);
  });
});

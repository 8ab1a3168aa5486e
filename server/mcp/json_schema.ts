// Tool schemas as MCP clients read them: zod -> JSON Schema, then rewritten into the spelling every
// client reads the same way (one job, apart from the handlers that list the tools).
import { z } from "zod";

/** Output objects may gain fields over time: clients must not reject a newer server's result. */
function openObjects(node: unknown): void {
  if (Array.isArray(node)) return node.forEach(openObjects);
  if (!node || typeof node !== "object") return;
  const o = node as Record<string, unknown>;
  if (o.additionalProperties === false) delete o.additionalProperties;
  Object.values(o).forEach(openObjects);
}

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "deprecated",
  "$comment",
]);
const SCHEMA_MAPS = ["properties", "patternProperties", "$defs", "dependentSchemas"];
const SCHEMA_LISTS = ["allOf", "anyOf", "oneOf", "prefixItems"];
const SCHEMA_ONE = ["items", "contains", "not", "propertyNames", "if", "then", "else"];
const OPEN_KEYWORDS = ["additionalProperties", "unevaluatedProperties"];

/**
 * Rewrites legal JSON Schema that MCP clients read unevenly into the spelling they all read (what
 * the Inspector's strict mode asks for): a `type` array (zod's nullable) becomes `anyOf` branches
 * of one type each, and an unconstrained `additionalProperties: {}` (zod's passthrough and
 * records of unknown) becomes `true`.
 */
export function portableSchema(node: unknown): unknown {
  if (!node || typeof node !== "object" || Array.isArray(node)) return node;
  const o: Record<string, unknown> = { ...(node as Record<string, unknown>) };
  for (const k of SCHEMA_MAPS) {
    const m = o[k];
    if (m && typeof m === "object" && !Array.isArray(m))
      o[k] = Object.fromEntries(Object.entries(m).map(([n, v]) => [n, portableSchema(v)]));
  }
  for (const k of SCHEMA_LISTS)
    if (Array.isArray(o[k])) o[k] = (o[k] as unknown[]).map(portableSchema);
  for (const k of SCHEMA_ONE) if (k in o) o[k] = portableSchema(o[k]);
  for (const k of OPEN_KEYWORDS) {
    const v = o[k];
    if (v && typeof v === "object" && Object.keys(v).every((x) => ANNOTATIONS.has(x))) o[k] = true;
    else if (k in o) o[k] = portableSchema(v);
  }
  if (Array.isArray(o.type)) {
    const types = o.type as string[];
    const notes: Record<string, unknown> = {};
    const rest: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o))
      if (k !== "type") (ANNOTATIONS.has(k) ? notes : rest)[k] = v;
    return {
      ...notes,
      anyOf: types.map((t) => (t === "null" ? { type: "null" } : { type: t, ...rest })),
    };
  }
  return o;
}

export function jsonSchema(schema: z.ZodType, io: "input" | "output"): Record<string, unknown> {
  let s = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Record<string, unknown>;
  delete s.$schema;
  if (io === "output") openObjects(s);
  s = portableSchema(s) as Record<string, unknown>;
  // MCP wants an object schema at the top; a union of objects is still an object.
  if (s.type !== "object") return { type: "object", ...s };
  return s;
}

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

/** zod's bounds of every `int()`: true of any JSON integer a client can hold, so they say nothing. */
function dropSafeIntegerBounds(node: unknown): void {
  if (Array.isArray(node)) return node.forEach(dropSafeIntegerBounds);
  if (!node || typeof node !== "object") return;
  const o = node as Record<string, unknown>;
  if (o.minimum === Number.MIN_SAFE_INTEGER) delete o.minimum;
  if (o.maximum === Number.MAX_SAFE_INTEGER) delete o.maximum;
  Object.values(o).forEach(dropSafeIntegerBounds);
}

type Node = Record<string, unknown>;

/** The object a schema describes, looking through a nullable union; undefined for other shapes. */
function objectOf(node: Node): Node | undefined {
  if (node.type === "object" && node.properties) return node;
  const branches = node.anyOf as Node[] | undefined;
  if (branches?.length === 2 && branches.some((b) => b.type === "null"))
    return branches.map(objectOf).find(Boolean);
  return undefined;
}

/**
 * Replaces a nested object (or list of objects) by `{type: "object"}` (`{type: "array"}`), with
 * the note its zod schema gives, if any: what a client needs to validate. Its field names are
 * left to the answers, which carry them (and to docs/tools.md): listed here they cost an agent
 * about 700 bytes of every tools/list. The server still checks every answer against the full
 * zod schema.
 */
function documentedObject(node: Node): Node {
  const obj = node.type === "object" && node.properties ? node : undefined;
  const itemObj =
    node.type === "array" ? objectOf((node.items as Node | undefined) ?? {}) : undefined;
  if (!obj && !itemObj) return node;
  const notes = [node.description, itemObj?.description].filter((d) => typeof d === "string");
  return {
    type: itemObj ? "array" : "object",
    ...(notes.length ? { description: notes.join("; ") } : {}),
  };
}

/** What no client needs to validate an answer: enums (the values are the tool's to say) and notes on scalars. */
function dropOutputDetail(root: Node): void {
  const branches = [root, ...((root.anyOf as Node[] | undefined) ?? [])];
  for (const b of branches)
    for (const p of Object.values((b.properties as Record<string, Node> | undefined) ?? {})) {
      delete p.enum;
      if (p.type !== "object" && p.type !== "array" && !p.anyOf) delete p.description;
    }
}

/**
 * Redundant spellings, in inputs and outputs: objects are open anyway (inputs too: see
 * openObjects), record keys are strings, and a nested object with no named property is just
 * `{type: "object"}` (a JSON schema argument, say). The root keeps its `properties` for clients
 * that look for them.
 */
function dropOpenDefaults(node: unknown, root = true): void {
  if (Array.isArray(node)) return node.forEach((n) => dropOpenDefaults(n, false));
  if (!node || typeof node !== "object") return;
  const o = node as Node;
  if (o.additionalProperties === true) delete o.additionalProperties;
  if (o.propertyNames && (o.propertyNames as Node).type === "string") delete o.propertyNames;
  const props = o.properties;
  if (!root && props && typeof props === "object" && Object.keys(props).length === 0)
    delete o.properties;
  for (const [k, v] of Object.entries(o)) {
    // A property named "properties" is a schema, not the keyword.
    if (k === "properties" && v && typeof v === "object")
      Object.values(v).forEach((p) => dropOpenDefaults(p, false));
    else dropOpenDefaults(v, false);
  }
}

/** A nullable field's schema without its null branch; undefined when it is not nullable. */
function nonNull(node: Node): Node | undefined {
  const branches = node.anyOf as Node[] | undefined;
  if (branches?.length !== 2 || !branches.some((b) => b.type === "null")) return undefined;
  return branches.find((b) => b.type !== "null");
}

/**
 * An output schema as tools/list publishes it: the top-level fields that are always there and
 * never null, typed (nested objects bare, see documentedObject); the others named in the
 * description, as `nullable` (always there, maybe null) or `optional` (maybe absent). A typed
 * field is therefore always there: a `required` list would repeat every name (about 800 bytes of
 * the agent's tools/list). Objects are open, so every answer still validates; the server checks
 * each against the full zod schema before it is sent (tools/dispatch/result.ts).
 */
function compactOutput(root: Node): Node {
  const top = (obj: Node): Node => {
    if (!obj.properties) return obj;
    const required = new Set((obj.required as string[] | undefined) ?? []);
    const props: Record<string, Node> = {};
    const nullable: string[] = [];
    const optional: string[] = [];
    for (const [k, v] of Object.entries(obj.properties as Record<string, Node>)) {
      if (!required.has(k)) optional.push(k);
      else if (nonNull(v)) nullable.push(k);
      else props[k] = documentedObject(v);
    }
    const notes = [
      ...(nullable.length ? [`nullable: ${nullable.join(", ")}`] : []),
      ...(optional.length ? [`optional: ${optional.join(", ")}`] : []),
    ];
    const { required: _all, ...rest } = obj;
    return {
      ...rest,
      properties: props,
      ...(notes.length ? { description: notes.join("; ") } : {}),
    };
  };
  const out = top(root);
  // The root is an object (jsonSchema says so): its branches need not repeat it.
  if (Array.isArray(out.anyOf))
    out.anyOf = (out.anyOf as Node[]).map((b) => {
      const { type: _object, ...rest } = top(b);
      return rest;
    });
  dropOutputDetail(out);
  return out;
}

export function jsonSchema(schema: z.ZodType, io: "input" | "output"): Record<string, unknown> {
  let s = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Record<string, unknown>;
  delete s.$schema;
  dropSafeIntegerBounds(s);
  // Inputs too: the server refuses an unknown argument with invalid_argument, naming it; saying
  // so in every object of every schema costs an agent bytes in every conversation.
  openObjects(s);
  s = portableSchema(s) as Record<string, unknown>;
  if (io === "output") s = compactOutput(s);
  dropOpenDefaults(s);
  // MCP wants an object schema at the top; a union of objects is still an object.
  if (s.type !== "object") return { type: "object", ...s };
  return s;
}

// Canonical JSON and argument digests. An approval is bound to sha256(tool + canonical args), so
// the same call must digest the same whatever the key order or number spelling, and a value that
// JSON cannot carry faithfully (NaN, Infinity, cycles) is refused rather than silently changed.

import { createHash } from "node:crypto";
import { PolicyError } from "./errors.js";

/** Arguments that steer how a call runs, not what it does; they never change the digest. */
export const CONTROL_FIELDS: ReadonlySet<string> = new Set(["approval_id", "wait"]);

export function canonicalJson(value: unknown): string {
  return write(value, new Set(), "$", false);
}

/** Below this length a number array is written as JSON text even in a digest. */
const PACK_MIN = 16;
const PACK_MARK = "\u0001f64:";
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Number arrays of PACK_MIN or more values (tensor data), as written inside an argument digest:
 * the SHA-256 of their float64 little-endian bytes (-0 as 0), behind a mark that canonical JSON
 * can never contain (a raw control character). Same values → same bytes, whatever their
 * spelling, like the JSON form; but formatting 784 doubles as shortest-round-trip text costs
 * ~30× more than hashing their bytes, and that was the largest cost of the gate.
 */
function packNumbers(arr: readonly unknown[], path: string): string | null {
  if (arr.length < PACK_MIN) return null;
  const f = new Float64Array(arr.length);
  for (let i = 0; i < arr.length; i++) {
    const x = arr[i];
    if (typeof x !== "number") return null;
    if (!Number.isFinite(x)) {
      throw new PolicyError(
        "invalid_argument",
        `${path}[${i}] is ${x}: only finite numbers are accepted`,
        { path: `${path}[${i}]` },
      );
    }
    f[i] = x === 0 ? 0 : x;
  }
  if (!LITTLE_ENDIAN) throw new Error("argument digests assume a little-endian host");
  return `${PACK_MARK}${arr.length}:${createHash("sha256").update(f).digest("hex")}`;
}

function write(v: unknown, stack: Set<object>, path: string, pack: boolean): string {
  if (v === null) return "null";
  switch (typeof v) {
    case "string":
      return JSON.stringify(v);
    case "boolean":
      return v ? "true" : "false";
    case "number":
      if (!Number.isFinite(v)) {
        throw new PolicyError(
          "invalid_argument",
          `${path} is ${v}: only finite numbers are accepted`,
          {
            path,
          },
        );
      }
      // -0 and 0 are the same argument; JS number formatting is otherwise canonical (shortest round-trip).
      return Object.is(v, -0) ? "0" : String(v);
    case "bigint":
      return v.toString();
    case "undefined":
    case "function":
    case "symbol":
      throw new PolicyError(
        "invalid_argument",
        `${path} is a ${typeof v}, which has no JSON form`,
        {
          path,
        },
      );
  }
  const obj = v as object;
  if (stack.has(obj)) {
    throw new PolicyError("invalid_argument", `${path} refers to itself (cycle)`, { path });
  }
  if (obj instanceof Date) return JSON.stringify(obj.toISOString());
  if (ArrayBuffer.isView(obj)) {
    const bytes = Buffer.from(obj.buffer, obj.byteOffset, obj.byteLength);
    return JSON.stringify(bytes.toString("base64"));
  }
  if (obj instanceof Map || obj instanceof Set) {
    throw new PolicyError("invalid_argument", `${path} is a Map/Set; use a plain object or array`, {
      path,
    });
  }
  stack.add(obj);
  try {
    if (Array.isArray(obj)) {
      // As JSON.stringify does, a hole or undefined inside an array becomes null. Finite numbers
      // (tensor data: most of a large call) are written inline, without building a path string
      // per element, which cost more than the hash itself; the output is the same.
      if (pack) {
        const packed = packNumbers(obj, path);
        if (packed !== null) return packed;
      }
      let out = "[";
      for (let i = 0; i < obj.length; i++) {
        const x: unknown = obj[i];
        if (i > 0) out += ",";
        if (typeof x === "number" && Number.isFinite(x)) out += Object.is(x, -0) ? "0" : String(x);
        else out += x === undefined ? "null" : write(x, stack, `${path}[${i}]`, pack);
      }
      return out + "]";
    }
    const rec = obj as Record<string, unknown>;
    const keys = Object.keys(rec)
      .filter((k) => rec[k] !== undefined)
      .sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${write(rec[k], stack, `${path}.${k}`, pack)}`).join(",")}}`;
  } finally {
    stack.delete(obj);
  }
}

export function sha256Hex(data: string): string {
  return createHash("sha256").update(data, "utf8").digest("hex");
}

/** The arguments without control fields (approval_id, wait). */
export function digestableArgs(args: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(args ?? {})) if (!CONTROL_FIELDS.has(k)) out[k] = v;
  return out;
}

export function argsDigest(tool: string, args: Record<string, unknown>): string {
  // The NUL separator keeps "ab"+"{..}" from colliding with "a"+"b{..}".
  // Tensor data is digested by its bytes (packNumbers), the rest as canonical JSON.
  return sha256Hex(`${tool}\u0000${write(digestableArgs(args), new Set(), "$", true)}`);
}

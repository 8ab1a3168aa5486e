// Where a JSON text differs from the value it should hold, named by the path of the field: a key
// that appears twice (JSON.parse keeps the last, another reader may keep the first), a field that
// should not be there or is missing, or a value that differs. For error messages that say which
// field of which line was edited (audit_export_proof.ts). Standalone: no imports.

export type JsonDifference =
  | { kind: "duplicate"; path: string }
  | { kind: "unknown" | "missing"; path: string }
  | { kind: "value"; path: string; actual: unknown; expected: unknown };

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** A string as JSON with every non-ASCII character escaped (safe to print). */
const quoted = (s: string) =>
  JSON.stringify(s).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );

/** `a.b`, `a["odd key"]`, `a[3]`: a field's path as the messages print it (ASCII only). */
export function fieldPath(parent: string, key: string | number): string {
  if (typeof key === "number") return `${parent}[${key}]`;
  if (NAME.test(key)) return parent ? `${parent}.${key}` : key;
  return `${parent}[${quoted(key)}]`;
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** The first key that appears twice in one object of `text` (valid JSON), or null. */
export function duplicateKey(text: string): string | null {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\r\n".includes(text[i]!)) i++;
  };
  const string = (): string => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  // Returns the path of a duplicate in the value at i (and moves past it), or null.
  const value = (path: string): string | null => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const keys = new Set<string>();
      for (;;) {
        ws();
        if (text[i] === "}") {
          i++;
          return null;
        }
        if (text[i] === ",") {
          i++;
          ws();
        }
        const key = string();
        const at = fieldPath(path, key);
        if (keys.has(key)) return at;
        keys.add(key);
        ws();
        i++; // the colon
        const dup = value(at);
        if (dup) return dup;
      }
    }
    if (c === "[") {
      i++;
      for (let n = 0; ; n++) {
        ws();
        if (text[i] === "]") {
          i++;
          return null;
        }
        if (text[i] === ",") i++;
        const dup = value(fieldPath(path, n));
        if (dup) return dup;
      }
    }
    if (c === '"') {
      string();
      return null;
    }
    while (i < text.length && !",]} \t\r\n".includes(text[i]!)) i++;
    return null;
  };
  return value("");
}

/** The first place where `actual` differs from `expected` (both parsed JSON), or null. */
export function jsonDifference(
  actual: unknown,
  expected: unknown,
  path = "",
): JsonDifference | null {
  if (isObject(expected) && isObject(actual)) {
    for (const k of Object.keys(actual))
      if (!Object.hasOwn(expected, k)) return { kind: "unknown", path: fieldPath(path, k) };
    for (const k of Object.keys(expected)) {
      if (!Object.hasOwn(actual, k)) return { kind: "missing", path: fieldPath(path, k) };
      const d = jsonDifference(actual[k], expected[k], fieldPath(path, k));
      if (d) return d;
    }
    return null;
  }
  if (Array.isArray(expected) && Array.isArray(actual) && expected.length === actual.length) {
    for (let n = 0; n < expected.length; n++) {
      const d = jsonDifference(actual[n], expected[n], fieldPath(path, n));
      if (d) return d;
    }
    return null;
  }
  if (isObject(expected) || isObject(actual) || Array.isArray(expected) || Array.isArray(actual))
    return { kind: "value", path, actual, expected };
  return actual === expected ? null : { kind: "value", path, actual, expected };
}

// The imports of a TypeScript source, for the boundary tests (test/unit/boundaries.test.ts,
// test/policies/boundaries.test.ts): static imports and re-exports, side-effect imports, and
// dynamic `import(...)` / `require(...)` with any quote, template strings included. A dynamic
// import whose specifier is not a literal cannot be checked, so it comes back with `spec: null`
// and the boundary tests refuse it.

export interface ImportSite {
  /** The specifier, or null when it is computed (a variable, a template with `${}`). */
  spec: string | null;
  line: number;
  /** The import as written, for the failure message. */
  text: string;
}

/** Comments blanked (their newlines kept, so lines still count): prose may say "import (". */
function withoutComments(src: string): string {
  return src
    .replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, " "))
    .replace(/(^|[^:\\])\/\/.*$/gm, "$1");
}

const LITERAL = /^(["'`])([^"'`$]*)\1$/;
const STATIC = /(?:\bfrom\s*|^\s*import\s+|^\s*export\s+)(["'`])([^"'`]*)\1/gm;
const DYNAMIC = /\b(?:import|require)\s*\(\s*([^)]*?)\s*\)/g;

export function importSites(source: string): ImportSite[] {
  const src = withoutComments(source);
  const lineOf = (i: number) => src.slice(0, i).split("\n").length;
  const sites: ImportSite[] = [];
  for (const m of src.matchAll(STATIC))
    sites.push({ spec: m[2]!, line: lineOf(m.index), text: m[0].trim() });
  for (const m of src.matchAll(DYNAMIC)) {
    const lit = LITERAL.exec(m[1]!);
    sites.push({ spec: lit ? lit[2]! : null, line: lineOf(m.index), text: m[0] });
  }
  return sites.sort((a, b) => a.line - b.line);
}

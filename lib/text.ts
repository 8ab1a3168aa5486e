// Characters that must never reach a reader as themselves: C0 (newline included), DEL, C1, the
// line and paragraph separators, and the bidirectional marks, embeddings, overrides and isolates.
// What callers write is shown in logs, the audit trail, the console and the CLI; these could move
// the cursor, erase a line, start a line that looks like a record, or reorder what is shown.
// In lib/, the dependency-free leaf every room may import.

/** The set as the body of a regular-expression class (`[${UNPRINTABLE_CLASS}]`). */
export const UNPRINTABLE_CLASS =
  "\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069";

/**
 * One word of a POSIX shell command line, as typed: as it is when it has nothing the shell would
 * read (a path of letters, digits and `_@%+=:,./-`), otherwise in single quotes.
 */
export function shellWord(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

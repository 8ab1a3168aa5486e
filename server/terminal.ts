// What the CLI prints to a terminal: text that came from callers (argument names in audit reasons,
// principal ids, approval previews, worker errors) must not move the cursor, erase lines, start a
// new line that looks like a record, or reorder what is shown. Every control character is written
// as a visible escape instead; the stored data is left as it was.

import { UNPRINTABLE_CLASS } from "../lib/text.js";

// Every unprintable character (lib/text.ts), and the same but the newline (see below).
const UNSAFE_AND_NEWLINE = new RegExp(`[${UNPRINTABLE_CLASS}]`, "g");
const UNSAFE = new RegExp(`(?!\\n)[${UNPRINTABLE_CLASS}]`, "g");

/** `\uXXXX`: also a valid JSON escape, so JSON output stays JSON with the same value. */
const escapeChar = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;

/**
 * One field or one line of output: every control character, newlines included, becomes a
 * visible `\uXXXX`, so what a caller wrote can never look like a line of its own.
 */
export function terminalField(text: string): string {
  return text.replace(UNSAFE_AND_NEWLINE, escapeChar);
}

/**
 * A whole block of output (the CLI's own line breaks kept): the last line of defence for every
 * terminal write. Fields that may hold a newline must be passed through terminalField first.
 */
export function terminalText(text: string): string {
  return text.replace(UNSAFE, escapeChar);
}

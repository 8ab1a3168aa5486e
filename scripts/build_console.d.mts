// Types for scripts/build_console.mjs (used by the browser suite's set-up).
export function consoleIsStale(): boolean;
export function buildConsole(): Promise<string>;

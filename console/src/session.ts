// The console's session as this script holds it: the signed-in principal and the CSRF token
// (in this module's memory only; the session itself is an HttpOnly cookie this script cannot
// read), and the one way to call /console/api.
import type { Json } from "./ui.js";

let csrf = "";
let me: Json | null = null;
let ended: (message: string) => void = () => {};

/** The signed-in principal (id, admin, ...), or null. */
export function currentSession(): Json | null {
  return me;
}

export function setSession(session: Json | null): void {
  me = session;
  csrf = session?.csrf ?? "";
}

/** Called when the server says the session is over (401 on any call but the session's own). */
export function onSessionEnded(fn: (message: string) => void): void {
  ended = fn;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export async function api(
  path: string,
  init: { method?: string; body?: unknown } = {},
): Promise<Json> {
  const res = await fetch(`/console/api/${path}`, {
    method: init.method ?? "GET",
    credentials: "same-origin",
    headers: {
      ...(init.body !== undefined ? { "content-type": "application/json" } : {}),
      ...(init.method && init.method !== "GET" && csrf ? { "x-csrf-token": csrf } : {}),
    },
    body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
  });
  const data = (await res.json().catch(() => ({}))) as Json;
  if (!res.ok) {
    if (res.status === 401 && path !== "session") ended("Your session ended; sign in again.");
    throw new ApiError(
      res.status,
      data.error?.code ?? "error",
      data.error?.message ?? res.statusText,
    );
  }
  return data;
}

// The browser's half of the passkey ceremonies: ask the server for options, let the
// authenticator sign (@simplewebauthn/browser wraps navigator.credentials and its encodings),
// send the answer back. The server decides everything; this only carries the messages.
import { startAuthentication, startRegistration } from "@simplewebauthn/browser";
import { api } from "./session.js";
import type { Json } from "./ui.js";

/** Passkeys need a secure context with a host name: http://localhost or https://name. */
export function passkeysUsable(): string | null {
  if (!window.isSecureContext || !window.PublicKeyCredential)
    return "Passkeys need a secure context: open the console on http://localhost or over HTTPS.";
  const host = location.hostname;
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(host) || host.startsWith("["))
    return `Passkeys need a host name, not an IP address: open http://localhost:${location.port}${location.pathname} instead.`;
  return null;
}

/** First passkey of an operator, with the code `tpu-mcp operators enrol NAME` printed. */
export async function enrolWithCode(code: string): Promise<Json> {
  const { nonce, options } = await api("passkeys/enrol/options", {
    method: "POST",
    body: { code },
  });
  const response = await startRegistration({ optionsJSON: options });
  return api("passkeys/enrol", { method: "POST", body: { code, nonce, response } });
}

export async function signInWithPasskey(): Promise<Json> {
  const { nonce, options } = await api("passkeys/sign-in/options", { method: "POST", body: {} });
  const response = await startAuthentication({ optionsJSON: options });
  return api("passkeys/sign-in", { method: "POST", body: { nonce, response } });
}

/** Another device for the signed-in operator; it waits for an approval by an existing passkey. */
export async function addPasskey(): Promise<Json> {
  const { nonce, options } = await api("passkeys/add/options", { method: "POST", body: {} });
  const response = await startRegistration({ optionsJSON: options });
  return api("passkeys/add", { method: "POST", body: { nonce, response } });
}

export async function approveEnrolment(id: string): Promise<Json> {
  const { nonce, options } = await api(`passkeys/${id}/approve/options`, {
    method: "POST",
    body: {},
  });
  const response = await startAuthentication({ optionsJSON: options });
  return api(`passkeys/${id}/approve`, { method: "POST", body: { nonce, response } });
}

/**
 * A decision signed with the operator's passkey: the server's challenge is bound to this
 * approval, its arguments, the estimate shown and the decision, so the signature covers them.
 */
export async function signDecision(
  id: string,
  decision: "approve" | "deny",
  reason: string,
): Promise<Json> {
  const { nonce, options } = await api(`approvals/${id}/${decision}/options`, {
    method: "POST",
    body: {},
  });
  const response = await startAuthentication({ optionsJSON: options });
  return api(`approvals/${id}/${decision}`, {
    method: "POST",
    body: { nonce, response, ...(reason ? { reason } : {}) },
  });
}

// What an agent with a shell and every token it could find tries against the operator console of
// a server with passkey rules (issue 21): run as the agent's OS user by
// test/browser/os_user_passkeys.test.ts, plain JavaScript so that user's node runs it as it is.
//   node console_attacker.mjs '{"base": "http://localhost:PORT", "tokens": {...}, "approval": "apr_…"}'
// Prints one JSON object: for each attempt, the HTTP status and the error code and message.
import { createHash, generateKeyPairSync, randomBytes, sign } from "node:crypto";

const { base, tokens, approval } = JSON.parse(process.argv[2]);
const origin = new URL(base).origin;
const results = {};

async function post(path, body, session) {
  const headers = { "content-type": "application/json", origin };
  if (session) Object.assign(headers, { cookie: session.cookie, "x-csrf-token": session.csrf });
  const r = await fetch(`${base}/console/api/${path}`, {
    method: "POST",
    headers,
    body: JSON.stringify(body ?? {}),
  });
  const json = await r.json().catch(() => ({}));
  return { status: r.status, json, cookie: r.headers.get("set-cookie") };
}

const outcome = (r) => ({
  status: r.status,
  code: r.json?.error?.code ?? null,
  message: r.json?.error?.message ?? null,
});

/**
 * A software authenticator: its own P-256 key, and flags that claim the user was present and
 * verified (nothing checks a program's claim but the key the server enrolled).
 */
function softAuthenticator() {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const ownId = randomBytes(16).toString("base64url");
  return {
    ownId,
    assert(options, credentialId = ownId) {
      const clientDataJSON = Buffer.from(
        JSON.stringify({ type: "webauthn.get", challenge: options.challenge, origin }),
      );
      const counter = Buffer.alloc(4);
      counter.writeUInt32BE(1000);
      const authenticatorData = Buffer.concat([
        createHash("sha256").update(options.rpId).digest(),
        Buffer.from([0x05]), // user present + user verified
        counter,
      ]);
      const signed = Buffer.concat([
        authenticatorData,
        createHash("sha256").update(clientDataJSON).digest(),
      ]);
      return {
        id: credentialId,
        rawId: credentialId,
        type: "public-key",
        clientExtensionResults: {},
        response: {
          authenticatorData: authenticatorData.toString("base64url"),
          clientDataJSON: clientDataJSON.toString("base64url"),
          signature: sign("sha256", signed, privateKey).toString("base64url"),
        },
      };
    },
  };
}

// A console session with each token it holds (the agent's own has no approvals:grant).
const sessions = {};
for (const [name, token] of Object.entries(tokens)) {
  const r = await post("session", { token });
  results[`sign_in_${name}`] = outcome(r);
  if (r.status === 200) sessions[name] = { cookie: r.cookie.split(";")[0], csrf: r.json.csrf };
}
const s = sessions.operator;
if (s) {
  results.approve = outcome(await post(`approvals/${approval}/approve`, {}, s));
  results.deny = outcome(await post(`approvals/${approval}/deny`, { reason: "agent" }, s));
  results.add_passkey = outcome(await post("passkeys/add/options", {}, s));
  results.approve_enrolment = outcome(
    await post(`passkeys/${randomBytes(16).toString("base64url")}/approve/options`, {}, s),
  );
  results.enrol_with_guessed_code = outcome(
    await post("passkeys/enrol/options", { code: randomBytes(15).toString("base64url") }, s),
  );
  const soft = softAuthenticator();
  // Forged decisions: signed by its own key, claiming the operator's enrolled credential; then
  // with its own credential (never enrolled).
  for (const [name, claim] of [
    ["forged_as_operator_credential", "enrolled"],
    ["forged_own_credential", "own"],
  ]) {
    const o = await post(`approvals/${approval}/approve/options`, {}, s);
    if (o.status !== 200) {
      results[name] = outcome(o);
      continue;
    }
    const enrolled = o.json.options.allowCredentials?.[0]?.id;
    const response = soft.assert(o.json.options, claim === "enrolled" ? enrolled : soft.ownId);
    results[name] = {
      ...outcome(await post(`approvals/${approval}/approve`, { nonce: o.json.nonce, response }, s)),
      claimed: claim === "enrolled" ? enrolled : soft.ownId,
    };
  }
  // Signing in with the software authenticator.
  const o = await post("passkeys/sign-in/options");
  results.sign_in_soft_passkey = outcome(
    await post("passkeys/sign-in", { nonce: o.json.nonce, response: soft.assert(o.json.options) }),
  );
}
process.stdout.write(JSON.stringify(results));

// The operator console (served at /console): sign-in, the navigation and the hash routes; each
// page lives in pages/, the DOM helpers in ui.ts, the session and the API in session.ts.
import "./style.css";
import { activityPage } from "./pages/activity.js";
import { approvalsPage } from "./pages/approvals.js";
import { benchmarksPage } from "./pages/benchmarks.js";
import { jobsPage } from "./pages/jobs.js";
import { alertsPage } from "./pages/alerts.js";
import { runtimePage } from "./pages/runtime.js";
import { enrolWithCode, passkeysUsable, signInWithPasskey } from "./passkeys.js";
import { passkeysPage } from "./pages/passkeys.js";
import { api, ApiError, currentSession, onSessionEnded, setSession } from "./session.js";
import { h, main, status, stopPage, type Json } from "./ui.js";

let events: EventSource | null = null;

function showSignIn(message = "") {
  stopPage();
  events?.close();
  events = null;
  setSession(null);
  document.getElementById("who")!.replaceChildren();
  document.getElementById("nav")!.hidden = true;
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const err = h("p", { class: "status bad", role: "alert", id: "signin-error" }, message);
  const fail = (x: unknown) => {
    err.textContent = (x as Error).message;
  };
  const unusable = passkeysUsable();
  const code = h("input", {
    id: "enrol-code",
    type: "text",
    autocomplete: "one-time-code",
    spellcheck: "false",
  });
  const passkeyCard = h(
    "section",
    { class: "card signin", id: "passkey-signin-card" },
    h("h1", {}, "Sign in"),
    unusable
      ? status(unusable, "bad")
      : h(
          "button",
          {
            type: "button",
            id: "passkey-signin",
            onclick: () => signInWithPasskey().then(start, fail),
          },
          "Sign in with a passkey",
        ),
    h(
      "details",
      { id: "enrol" },
      h("summary", {}, "Enrol a passkey"),
      h(
        "p",
        {},
        "Paste the one-time code that `tpu-mcp operators enrol NAME` printed on the server. Your authenticator asks for your PIN or biometric.",
      ),
      h("label", { for: "enrol-code" }, "Enrolment code"),
      code,
      h(
        "button",
        {
          type: "button",
          id: "enrol-button",
          disabled: Boolean(unusable),
          onclick: async () => {
            const c = code.value.trim();
            code.value = "";
            try {
              const r = await enrolWithCode(c);
              err.className = "status ok";
              err.textContent =
                r.passkey.status === "active"
                  ? `Passkey enrolled for ${r.passkey.operator}. Sign in with it.`
                  : `Passkey enrolled for ${r.passkey.operator}; it works once an operator approves it with their passkey.`;
            } catch (x) {
              err.className = "status bad";
              fail(x);
            }
          },
        },
        "Enrol",
      ),
    ),
  );
  const form = h(
    "form",
    { class: "card signin", id: "signin" },
    h("h2", {}, "Sign in with a token"),
    h(
      "p",
      {},
      "Paste an operator token (one that holds approvals:grant or admin). It is exchanged for a session cookie and is not kept by this page. A token session cannot decide approvals whose rule requires a passkey.",
    ),
    h("label", { for: "token" }, "Operator token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value;
    input.value = "";
    try {
      const s = await api("session", { method: "POST", body: { token } });
      start(s);
    } catch (x) {
      fail(x);
      input.focus();
    }
  });
  main().replaceChildren(passkeyCard, form, err);
}

async function signOut() {
  try {
    await api("session", { method: "DELETE" });
  } finally {
    showSignIn("Signed out.");
  }
}

function start(session: Json) {
  setSession(session);
  document.getElementById("nav")!.hidden = false;
  document
    .getElementById("who")!
    .replaceChildren(
      h(
        "span",
        {},
        `${session.principal}${session.admin ? " (admin)" : ""} · ${session.passkey ? "passkey" : "token"}`,
      ),
      h("button", { type: "button", class: "link", id: "signout", onclick: signOut }, "Sign out"),
    );
  events?.close();
  events = new EventSource("/console/api/events");
  events.addEventListener("approval", (e) => {
    const data = JSON.parse((e as MessageEvent).data);
    window.dispatchEvent(new CustomEvent("approval", { detail: data }));
  });
  if (!location.hash || location.hash === "#") location.hash = "#/approvals";
  else route();
}

const PAGES: Record<string, (root: HTMLElement) => Promise<void>> = {
  approvals: approvalsPage,
  activity: activityPage,
  jobs: jobsPage,
  alerts: alertsPage,
  runtime: runtimePage,
  benchmarks: benchmarksPage,
  passkeys: passkeysPage,
};

async function route() {
  if (!currentSession()) return;
  stopPage();
  // #/approvals/apr_… (the link a webhook carries) opens the Approvals page at that request.
  const [name = "approvals", target] = (location.hash.replace(/^#\/?/, "") || "approvals").split(
    "/",
  );
  const page = PAGES[name] ?? approvalsPage;
  for (const a of document.querySelectorAll<HTMLAnchorElement>("#nav a")) {
    if (a.getAttribute("href") === `#/${name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const root = h("div", { class: "page", "data-page": name });
  main().replaceChildren(root);
  try {
    await page(root);
    if (target) root.querySelector(`[data-id="${CSS.escape(target)}"]`)?.scrollIntoView();
  } catch (x) {
    if (!(x instanceof ApiError && x.status === 401))
      root.append(status((x as Error).message, "bad"));
  }
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · tpu-mcp console`;
}

window.addEventListener("hashchange", () => void route());
window.addEventListener("DOMContentLoaded", async () => {
  try {
    const s = await api("session");
    if (s.signed_in) start(s);
    else showSignIn();
  } catch {
    showSignIn();
  }
});

onSessionEnded(showSignIn);

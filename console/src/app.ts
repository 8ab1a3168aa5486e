// The operator console (served at /console): sign-in, the navigation and the hash routes; each
// page lives in pages/, the DOM helpers in ui.ts, the session and the API in session.ts.
import "./style.css";
import { activityPage } from "./pages/activity.js";
import { approvalsPage } from "./pages/approvals.js";
import { benchmarksPage } from "./pages/benchmarks.js";
import { jobsPage } from "./pages/jobs.js";
import { runtimePage } from "./pages/runtime.js";
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
  const form = h(
    "form",
    { class: "card signin", id: "signin" },
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      "Paste an operator token (one that holds approvals:grant or admin). It is exchanged for a session cookie and is not kept by this page.",
    ),
    h("label", { for: "token" }, "Operator token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    err,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value;
    input.value = "";
    try {
      const s = await api("session", { method: "POST", body: { token } });
      start(s);
    } catch (x) {
      err.textContent = (x as Error).message;
      input.focus();
    }
  });
  main().replaceChildren(form);
  input.focus();
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
      h("span", {}, `${session.principal}${session.admin ? " (admin)" : ""}`),
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
  runtime: runtimePage,
  benchmarks: benchmarksPage,
};

async function route() {
  if (!currentSession()) return;
  stopPage();
  const name = location.hash.replace(/^#\/?/, "") || "approvals";
  const page = PAGES[name] ?? approvalsPage;
  for (const a of document.querySelectorAll<HTMLAnchorElement>("#nav a")) {
    if (a.getAttribute("href") === `#/${name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const root = h("div", { class: "page", "data-page": name });
  main().replaceChildren(root);
  try {
    await page(root);
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

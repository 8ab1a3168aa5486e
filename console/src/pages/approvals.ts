// The Approvals page: every pending request (paged), with approve and deny; the history.
import { compactJson } from "../chart.js";
import { signDecision } from "../passkeys.js";
import { api, ApiError, currentSession } from "../session.js";
import { h, when, countdown, estimateText, status, table, every, on, type Json } from "../ui.js";

function approvalCard(a: Json, refresh: () => void): HTMLElement {
  // What the operator decides on: the server's one payload for it, whose hash the audit keeps.
  const shown = a.shown;
  const reason = h("input", {
    type: "text",
    id: `reason-${a.id}`,
    placeholder: "reason (shown to the agent)",
    maxlength: "500",
  });
  const msg = h("p", { class: "status", role: "status" });
  // A passkey session signs every decision (the strongest evidence it can give); a token
  // session can decide only rules that accept a token, and the server says so otherwise.
  const signs = currentSession()?.passkey === true;
  const decide = async (decision: "approve" | "deny") => {
    try {
      if (signs) await signDecision(a.id, decision, decision === "deny" ? reason.value : "");
      else
        await api(`approvals/${a.id}/${decision}`, {
          method: "POST",
          body: decision === "deny" ? { reason: reason.value } : {},
        });
      msg.textContent = decision === "approve" ? "Approved." : "Denied.";
      refresh();
    } catch (x) {
      msg.className = "status bad";
      msg.setAttribute("role", "alert");
      msg.textContent = `${(x as ApiError).code}: ${(x as Error).message}`;
    }
  };
  const self = !a.can_decide;
  const expires = h(
    "span",
    { class: "countdown", "data-expires": a.expires_at },
    countdown(a.expires_at),
  );
  return h(
    "article",
    { class: "card approval", "data-id": a.id, "aria-label": `approval ${a.id}` },
    h(
      "header",
      {},
      h(
        "h3",
        {},
        h("span", { class: "principal" }, shown.requested_by),
        " → ",
        h("code", {}, shown.tool),
      ),
      h("span", { class: "expiry" }, "expires in ", expires),
    ),
    h(
      "dl",
      {},
      h("dt", {}, "Estimate"),
      h("dd", {}, estimateText(shown.estimate)),
      h("dt", {}, "Rule"),
      h("dd", {}, shown.rule ?? "(not recorded)"),
      h("dt", {}, "Decision needs"),
      h(
        "dd",
        { class: `assurance ${shown.assurance}` },
        shown.assurance === "passkey"
          ? "a passkey (signed in this console; a token or the CLI is refused)"
          : shown.assurance === "client_form"
            ? "an operator token or a passkey, or whoever answers the client's form (the agent itself can)"
            : "an operator token or a passkey",
      ),
      h("dt", {}, "Requested"),
      h("dd", {}, when(shown.requested_at)),
      h("dt", {}, "Who else can decide"),
      h("dd", {}, a.deciders.length ? a.deciders.join(", ") : "nobody else holds approvals:grant"),
      h("dt", {}, "Request id"),
      h("dd", {}, h("code", {}, shown.approval_id)),
      h("dt", {}, "Shown (SHA-256)"),
      h("dd", {}, h("code", { class: "shown-sha256" }, a.shown_sha256)),
    ),
    h("p", { class: "label" }, "Exact arguments (redacted fields are summaries, as in the audit):"),
    h("pre", { class: "args", tabindex: "0" }, compactJson(shown.args)),
    a.assurance === "passkey" && !signs && !self
      ? h(
          "p",
          { class: "status info needs-passkey" },
          "This rule requires a passkey: sign out and sign in with your passkey to decide it.",
        )
      : null,
    self
      ? h(
          "p",
          { class: "status info self" },
          `${a.principal} requested this: another operator must decide it (self-approval is refused).`,
        )
      : null,
    h(
      "div",
      { class: "actions" },
      h("label", { for: `reason-${a.id}`, class: "sr-only" }, "Reason"),
      reason,
      h(
        "button",
        { type: "button", class: "approve", disabled: self, onclick: () => decide("approve") },
        signs ? "Approve with passkey" : "Approve",
      ),
      h(
        "button",
        { type: "button", class: "deny", disabled: self, onclick: () => decide("deny") },
        signs ? "Deny with passkey" : "Deny",
      ),
    ),
    msg,
  );
}

export async function approvalsPage(root: HTMLElement) {
  const pending = h("section", { id: "pending", "aria-live": "polite" });
  const history = h("section", { id: "history" });
  const pager = h("nav", { id: "approvals-pager", "aria-label": "approval pages" });
  root.replaceChildren(
    h("h1", {}, "Approvals"),
    h("p", { class: "hint" }, "New requests appear here as agents make them."),
    pending,
    h("h2", {}, "History"),
    history,
    pager,
  );
  // Pages of PAGE_SIZE: every pending approval comes first, however many newer ones there are.
  const PAGE_SIZE = 100;
  let offset = 0;
  let busy = false;
  const refresh = async () => {
    if (busy) return;
    busy = true;
    try {
      const data = await api(`approvals?offset=${offset}&limit=${PAGE_SIZE}`);
      const total = data.pending_total + data.history_total;
      if (offset > 0 && offset >= total) {
        offset = Math.max(0, total - PAGE_SIZE); // the last page emptied: show the one before
        busy = false;
        return void refresh();
      }
      const go = (to: number) => () => {
        offset = to;
        void refresh();
      };
      pager.replaceChildren(
        ...(total > PAGE_SIZE
          ? [
              h(
                "button",
                {
                  type: "button",
                  disabled: offset === 0,
                  onclick: go(Math.max(0, offset - PAGE_SIZE)),
                },
                "Previous",
              ),
              h(
                "span",
                { class: "hint" },
                ` ${offset + 1}–${Math.min(offset + PAGE_SIZE, total)} of ${total} `,
              ),
              h(
                "button",
                {
                  type: "button",
                  disabled: offset + PAGE_SIZE >= total,
                  onclick: go(offset + PAGE_SIZE),
                },
                "Next",
              ),
            ]
          : []),
      );
      pending.replaceChildren(
        h(
          "h2",
          {},
          data.pending_total > data.pending.length
            ? `Pending (${data.pending_total}; ${data.pending.length} on this page)`
            : `Pending (${data.pending_total})`,
        ),
        ...(data.pending.length
          ? data.pending.map((a: Json) => approvalCard(a, refresh))
          : [
              status(
                data.pending_total
                  ? "The pending ones are on the previous pages."
                  : "Nothing is waiting for a decision.",
              ),
            ]),
      );
      history.replaceChildren(
        data.history.length === 0
          ? status(data.history_total ? "More history on the next pages." : "No decisions yet.")
          : table(
              [
                "outcome",
                "principal",
                "tool",
                "decided by",
                "reason",
                "requested",
                "decided / used",
              ],
              data.history.map((a: Json) => [
                h("span", { class: `badge ${a.status}` }, a.status),
                a.principal,
                h("code", {}, a.tool),
                a.decided_by ?? "–",
                a.reason ?? "",
                when(a.created_at),
                when(a.used_at ?? a.decided_at),
              ]),
              "approval history",
            ),
      );
    } catch (x) {
      pending.replaceChildren(status((x as Error).message, "bad"));
    } finally {
      busy = false;
    }
  };
  await refresh();
  on("approval", () => void refresh());
  every(1000, () => {
    for (const el of root.querySelectorAll<HTMLElement>(".countdown"))
      el.textContent = countdown(el.dataset.expires!);
  });
}

// The Passkeys page: every operator's passkeys; adding one on this device (from a passkey
// session) and approving a waiting one with your own passkey.
import { addPasskey, approveEnrolment } from "../passkeys.js";
import { api, ApiError } from "../session.js";
import { h, when, status, table, type Json } from "../ui.js";

export async function passkeysPage(root: HTMLElement) {
  const msg = h("p", { class: "status", role: "status", id: "passkeys-status" });
  const list = h("section", { id: "passkeys" });
  const say = (text: string, kind: "ok" | "bad") => {
    msg.className = `status ${kind}`;
    msg.setAttribute("role", kind === "bad" ? "alert" : "status");
    msg.textContent = text;
  };
  const failed = (x: unknown) =>
    say(`${(x as ApiError).code ?? "error"}: ${(x as Error).message}`, "bad");
  const refresh = async () => {
    const data = await api("passkeys");
    const signed = data.signed_with_passkey as boolean;
    list.replaceChildren(
      data.passkeys.length === 0
        ? status("No passkeys enrolled yet: run `tpu-mcp operators enrol NAME` on the server.")
        : table(
            ["operator", "status", "created", "last used", "authenticator", ""],
            data.passkeys.map((c: Json) => [
              c.operator,
              h("span", { class: `badge ${c.status}` }, c.status),
              when(c.created_at),
              when(c.last_used_at),
              h("code", {}, c.aaguid),
              c.status === "pending" && signed
                ? h(
                    "button",
                    {
                      type: "button",
                      class: "approve-passkey",
                      "data-id": c.id,
                      onclick: () =>
                        approveEnrolment(c.id).then(() => {
                          say(`Passkey of ${c.operator} approved.`, "ok");
                          void refresh();
                        }, failed),
                    },
                    "Approve with my passkey",
                  )
                : "",
            ]),
            "passkeys",
          ),
    );
    add.disabled = !signed;
  };
  const add = h(
    "button",
    {
      type: "button",
      id: "add-passkey",
      onclick: () =>
        addPasskey().then(() => {
          say("Passkey added; it works once a passkey already enrolled approves it.", "ok");
          void refresh();
        }, failed),
    },
    "Add a passkey on this device",
  );
  root.replaceChildren(
    h("h1", {}, "Passkeys"),
    h(
      "p",
      { class: "hint" },
      "A new passkey (another device, another operator) works only once an enrolled passkey approves it. Signed in with a token, this page only lists.",
    ),
    add,
    msg,
    list,
  );
  await refresh();
}

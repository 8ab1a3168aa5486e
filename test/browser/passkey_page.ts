// What the passkey suites do in a page: a browser context whose page has the DevTools virtual
// authenticator (user verification on, a resident key, presence simulated), and an operator's
// first enrolment with the CLI's code followed by a passkey sign-in.
import type { Browser, BrowserContext, CDPSession, Page } from "playwright-core";
import { expect } from "vitest";

export interface PasskeyPage {
  ctx: BrowserContext;
  page: Page;
  cdp: CDPSession;
  /** The virtual authenticator's id (for its credentials and user-verification switch). */
  id: string;
}

export async function passkeyPage(browser: Browser, initScript?: () => void): Promise<PasskeyPage> {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  if (initScript) await ctx.addInitScript(initScript);
  const page = await ctx.newPage();
  const cdp = await ctx.newCDPSession(page);
  await cdp.send("WebAuthn.enable");
  const { authenticatorId: id } = await cdp.send("WebAuthn.addVirtualAuthenticator", {
    options: {
      protocol: "ctap2",
      transport: "internal",
      hasResidentKey: true,
      hasUserVerification: true,
      isUserVerified: true,
      automaticPresenceSimulation: true,
    },
  });
  return { ctx, page, cdp, id };
}

/** Enrols a passkey in the console with a one-time code, then signs in with it as `operator`. */
export async function enrolAndSignIn(
  page: Page,
  base: string,
  code: string,
  operator: string,
): Promise<void> {
  await page.goto(`${base}/console/`);
  await page.click("#enrol summary");
  await page.fill("#enrol-code", code);
  await page.click("#enrol-button");
  await expect
    .poll(() => page.textContent("#signin-error"))
    .toContain(`Passkey enrolled for ${operator}. Sign in with it.`);
  await page.click("#passkey-signin");
  await page.waitForSelector("#signout");
  expect(await page.textContent("#who")).toContain(`${operator} · passkey`);
}

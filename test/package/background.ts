// Stops the background set-up a test's server started (detached: it leads its own process
// group, pip and python with it) and waits until it is gone, so its folder can be removed.
import { readFileSync } from "node:fs";
import { join } from "node:path";

export async function stopBackgroundSetup(dataHome: string): Promise<void> {
  let pid: number;
  try {
    const r = JSON.parse(readFileSync(join(dataHome, "setup.json"), "utf8"));
    if (r.state !== "running") return;
    pid = r.pid;
  } catch {
    return; // none was started
  }
  try {
    process.kill(-pid, "SIGTERM");
  } catch {
    return; // already gone
  }
  for (let i = 0; i < 100; i++) {
    try {
      process.kill(-pid, 0);
    } catch {
      return;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  process.kill(-pid, "SIGKILL");
}

import { connectStdio, writeConfig } from "./helpers/server.ts";
const cfg = writeConfig();
for (let i = 0; i < 3; i++) {
  const t0 = performance.now();
  const c = await connectStdio(cfg);
  await c.client.listTools();
  console.log("tools/list after", (performance.now() - t0).toFixed(0), "ms");
  await c.close();
}

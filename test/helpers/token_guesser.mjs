// A process with no token that guesses as fast as it can from its own address (on one machine,
// 127.0.0.1 like every other client): wrong bearer tokens on /mcp and wrong console sign-ins,
// until it is sent SIGTERM. Plain JavaScript, a process of its own (issue 33: one token-less
// process must not lock out the valid clients of the same address).
//   node token_guesser.mjs '{"base": "http://127.0.0.1:PORT"}'
// Prints one JSON object when stopped: how many answers of each HTTP status each surface got.
const { base } = JSON.parse(process.argv[2]);
const counts = { mcp: {}, console: {} };
let stop = false;
process.on("SIGTERM", () => (stop = true));

const tally = (surface, status) => (counts[surface][status] = (counts[surface][status] ?? 0) + 1);

async function guess(i) {
  const mcp = await fetch(`${base}/mcp`, {
    method: "POST",
    headers: {
      authorization: `Bearer guess-${process.pid}-${i}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
    },
    body: "{}",
  }).catch(() => null);
  tally("mcp", mcp?.status ?? 0);
  await mcp?.body?.cancel();
  const con = await fetch(`${base}/console/api/session`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token: `guess-${process.pid}-${i}` }),
  }).catch(() => null);
  tally("console", con?.status ?? 0);
  await con?.body?.cancel();
}

// A few guesses in flight at once, as a script with Promise.all would send them.
let i = 0;
await Promise.all(
  Array.from({ length: 4 }, async () => {
    while (!stop) await guess(i++);
  }),
);
process.stdout.write(JSON.stringify(counts) + "\n");

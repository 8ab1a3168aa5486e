#!/usr/bin/env node
// `npm pack` / `npm publish` run this first: the package ships no TypeScript and no build tools,
// so the CLI bundle (dist/cli.mjs) and the console and MCP App assets (dist/console) are built
// now, fresh, whatever the checkout's dist/ held.
import { buildCli } from "./build.mjs";
import { buildConsole } from "./build_console.mjs";

await buildCli({ quiet: true });
await buildConsole();
process.stderr.write("[prepack] dist/cli.mjs and dist/console built\n");

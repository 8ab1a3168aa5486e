"""Text adapters: a sentence-transformer encoder and a causal LM (generation: see ../generation)."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from ..catalog import Catalog, Entry
from ..errors import WorkerError, invalid
from ..generation.chat import ChatTemplate, load_chat_template, no_chat_template
from ..generation.grammar import Grammars
from ..generation.params import GenRequest, parse_generation, parse_prefix_key
from ..generation.slots import max_positions, static_cache_problem
from ..generation.tools import render_chat
from ..inputs import check_texts, seq_len_arg
from ..loaders import inside
from ..platforms import platform_for
from ..shapes import plan_for
from .base import Adapter, Output, Prepared, seq_bucket


def safe_file(model_dir: str, name: str, catalog: Catalog, entry: Entry) -> str:
    real = os.path.realpath(os.path.join(model_dir, name))
    if not any(inside(real, r) for r in catalog.roots):
        raise WorkerError("path_outside_roots", f"model {entry.id!r}: {name} points outside the model roots")
    if not os.path.isfile(real):
        raise WorkerError("weights_missing", f"model {entry.id!r}: {name} is missing from the model directory")
    return real


def load_tokenizer(model_dir: str, catalog: Catalog, entry: Entry):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(safe_file(model_dir, "tokenizer.json", catalog, entry))
    tok.no_padding()
    tok.no_truncation()
    return tok


def _random_ids(batch: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = min(1000, max(vocab - 1, 1))
    return torch.randint(low, vocab, (batch, seq_len), generator=g)


def pooled_embedding(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The encoder's last hidden state mean-pooled over the attention mask, L2-normalised (what
    sentence-transformers computes); the benchmark's training loss pools the same way."""
    hidden = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).to(torch.float32)
    # Pool in float32 so bf16/fp16 models lose no extra precision in the reduction.
    summed = (hidden.to(torch.float32) * mask).sum(dim=1)
    pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


class SentenceEmbedder(Adapter):
    """Transformer encoder + attention-mask mean pooling + L2 normalisation (sentence-transformers)."""

    architecture = "sentence-transformer"

    def __init__(self, entry, model, device, dtype, tokenizer, max_len: int, pad_id: int) -> None:
        super().__init__(entry, model, device, dtype)
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.pad_id = pad_id
        self.vocab = int(model.config.vocab_size)
        ids = tokenizer.encode("").ids  # special tokens the post-processor wraps around text
        self.cls_id = ids[0] if ids else None
        self.sep_id = ids[-1] if len(ids) > 1 else None
        self.plan = plan_for(entry, max_len)

    def _encode(self, texts: list[str], limit: int) -> list[list[int]]:
        out = []
        for enc in self.tokenizer.encode_batch(texts):
            ids = enc.ids
            if len(ids) > limit:
                # Keep the closing special token, as the HF tokenizer's truncation does.
                ids = [*ids[: limit - 1], ids[-1]] if self.sep_id is not None else ids[:limit]
            out.append(ids)
        return out

    def prepare(self, args, tensors) -> Prepared:
        if tensors:
            raise invalid(f"model {self.entry.id!r} takes texts, not tensors")
        texts = check_texts(self.entry, args)
        limit = seq_len_arg(args, self.max_len)
        return Prepared(("embed",), len(texts), self._encode(texts, limit))

    def _pad(self, rows: list[list[int]], length: int, batch: int) -> dict[str, torch.Tensor]:
        """`rows` right padded to [batch, length]; rows past them hold one pad token (so no row of
        the attention is empty) and are dropped from the answer. Each row attends to its own
        tokens alone and pools over its mask, so the padding changes no real row."""
        ids = torch.full((batch, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, length), dtype=torch.long)
        mask[len(rows) :, 0] = 1
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _embed(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return pooled_embedding(self.model, inputs)

    def run_batch(self, batch, should_stop) -> list[Output]:
        rows = [r for p in batch for r in p.payload]
        length = self.plan.length(max(len(r) for r in rows))
        bucket = self.plan.batch(len(rows))
        with torch.no_grad():
            emb = self._embed(self._pad(rows, length, bucket)).to("cpu")
        self.shapes.record("forward", bucket, length, sum(len(r) for r in rows))
        outs, pos = [], 0
        for p in batch:
            part = emb[pos : pos + p.items].contiguous()
            pos += p.items
            outs.append(Output({"task": "embedding", "shape": list(part.shape), "seq_bucket": length}, [part]))
        return outs

    def example(self, batch, seq_len, seed=0):
        seq_len = min(seq_len or 128, self.max_len)
        ids = _random_ids(batch, seq_len, self.vocab, seed)
        if self.cls_id is not None:
            ids[:, 0] = self.cls_id
        if self.sep_id is not None:
            ids[:, -1] = self.sep_id
        return {"input_ids": ids.to(self.device), "attention_mask": torch.ones_like(ids).to(self.device)}

    def forward_example(self, inputs):
        return self._embed(inputs)

    def pad_to_plan(self, inputs):
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        n, s = ids.shape
        batch, length = self.plan.batch(n), self.plan.length(s)
        rows = [r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu(), strict=True)]
        return self._pad(rows, length, batch), batch, length, int(mask.sum())

    def unpad(self, out, inputs):
        return out[: inputs["input_ids"].shape[0]]

    def default_seq_len(self):
        return min(128, self.max_len)


class CausalLM(Adapter):
    """Decoder-only LM: `prepare` validates generation requests (texts or chat messages and the
    sampling arguments) for the model's decode loop (generation/loop.py), which drives
    `prefill` and `step`: the only decode loop, the one the benchmark times too."""

    architecture = "causal-lm"

    def __init__(self, entry, model, device, dtype, tokenizer, max_len: int, chat=None) -> None:
        super().__init__(entry, model, device, dtype)
        cfg = model.config
        self.tokenizer = tokenizer
        self.chat = chat  # generation.chat.ChatTemplate, or None: chat is refused
        self.vocab = int(cfg.vocab_size)
        self.n_positions = max_positions(cfg)
        self.max_len = min(max_len, self.n_positions)
        self.plan = plan_for(entry, self.max_len)
        self.pad_id = valid_id(cfg.pad_token_id, self.vocab, 0)
        self.eos_id = valid_id(cfg.eos_token_id, self.vocab, None)
        self.bos_id = valid_id(cfg.bos_token_id, self.vocab, self.eos_id if self.eos_id is not None else 0)
        # transformers renamed past_key_values -> cache in 5.x; support both spellings.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.grammars = Grammars(tokenizer, self.vocab, self.eos_id)  # structured output

    def _dynamic(self):
        # The static decode loop's shapes are the plan's: one static graph each. A dynamic cache
        # grows every step: let dynamo mark that dimension dynamic, where the backend allows it
        # (TorchTPU does not: see TpuPlatform.compile_dynamic).
        if static_cache_problem(self.eager_model) is None:
            return False
        return platform_for(self.device).compile_dynamic

    def prepare(self, args, tensors) -> Prepared:
        if tensors:
            raise invalid(f"model {self.entry.id!r} takes texts or messages, not tensors")
        call = parse_generation(self.entry, args, self.max_len)
        n = call.params.max_new_tokens
        limit = min(call.seq_len, self.n_positions - n)
        if call.messages is not None:
            prompts = [self._chat_prompt(call.messages, call.tools, args, limit, n)]
        else:
            prompts = prompt_ids(self.tokenizer, call.texts, limit, self.bos_id)
        grammar = self.grammars.compile(call.params.response_format) if call.params.response_format else None
        return Prepared(("generate",), len(prompts), GenRequest(prompts, call.params, parse_prefix_key(args), grammar))

    def _chat_prompt(self, messages: list[dict], tools, args: dict, limit: int, max_new: int) -> list[int]:
        if self.chat is None:
            raise no_chat_template(self.entry)
        add = args.get("add_generation_prompt", True)
        if not isinstance(add, bool):
            raise invalid("args.add_generation_prompt must be true or false")
        ids = self.tokenizer.encode(render_chat(self.chat, messages, tools, add), add_special_tokens=False).ids
        if len(ids) > limit:
            # Cutting a conversation would drop its system prompt or first turns silently: refuse.
            raise invalid(
                f"the conversation is {len(ids)} tokens with the chat template; this model takes at most {limit} "
                f"prompt tokens with max_new_tokens={max_new}: shorten it"
            )
        return ids or [self.bos_id]

    # -- the decode loop's steps ------------------------------------------------------------
    def _forward(self, ids, mask, pos, cache=None, cache_position=None):
        kw = {self._cache_kw: cache} if cache is not None else {}
        if cache_position is not None:
            kw["cache_position"] = cache_position
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kw, **self._last_only)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return out.logits[:, -1, :], cache

    def padded_prompts(self, prompts: list[list[int]], batch: int, length: int):
        """`prompts` left padded to [batch, length] (rows past the prompts hold one pad token, so
        no row of the attention is empty): (ids, mask, positions) on the device."""
        # Built as lists, then one tensor each: no op at a prompt's own length (census.py).
        pad, n = self.pad_id, len(prompts)
        ids = [[pad] * (length - len(p)) + list(p) for p in prompts] + [[pad] * length] * (batch - n)
        mask = [[0] * (length - len(p)) + [1] * len(p) for p in prompts] + [[0] * (length - 1) + [1]] * (batch - n)
        ids_t = torch.tensor(ids, dtype=torch.long).to(self.device)
        mask_t = torch.tensor(mask, dtype=torch.long).to(self.device)
        return ids_t, mask_t, (mask_t.cumsum(-1) - 1).clamp(min=0)

    def prefill_padded(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor):
        """The forward of `padded_prompts`' tensors: (last logits [batch, vocab], per-layer keys
        and values [batch, heads, length, dim])."""
        logits, cache = self._forward(ids, mask, pos)
        return logits, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]

    def prefill_static(self, prompts: list[list[int]], batch: int, length: int):
        """A prefill at one of the plan's shapes [batch, length]: (last logits [batch, vocab],
        per-layer keys and values [batch, heads, length, dim], mask, last positions [batch, 1])."""
        ids, mask, pos = self.padded_prompts(prompts, batch, length)
        logits, keys, values = self.prefill_padded(ids, mask, pos)
        return logits, keys, values, mask, pos[:, -1:]

    def step_static(self, tokens: torch.Tensor, cache, mask: torch.Tensor, pos: torch.Tensor, column: torch.Tensor):
        """One token per slot of a static cache view (generation/slots.py): logits [slots, vocab]."""
        logits, _ = self._forward(tokens[:, None], mask, pos, cache, cache_position=column)
        return logits

    def extend_static(self, ids: torch.Tensor, cache, mask: torch.Tensor, pos: torch.Tensor, columns: torch.Tensor):
        """Several tokens [b, n] into b slots' static cache view, after the keys and values
        already there (prompts behind their cached prefixes): last logits [b, vocab]."""
        logits, _ = self._forward(ids, mask, pos, cache, cache_position=columns)
        return logits

    def prefill(self, prompts: list[list[int]], room: int):
        """Runs the prompts (left padded to a bucket, leaving `room` positions to generate):
        (last logits [n, vocab], cache, mask [n, length], last positions [n, 1])."""
        b = len(prompts)
        longest = max(len(p) for p in prompts)
        # Bucket the prompt length (left padding) so compiled graphs are reused across requests.
        length = max(longest, seq_bucket(longest, min(self.max_len, self.n_positions - room)))
        ids = torch.full((b, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, pos)
        return logits, cache, mask, pos[:, -1:]

    def step(self, tokens: torch.Tensor, cache, mask: torch.Tensor, pos: torch.Tensor):
        """Feeds one token per row: (logits [b, vocab], cache, mask, positions)."""
        mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=mask.device)], dim=1)
        pos = pos + 1
        logits, cache = self._forward(tokens[:, None], mask, pos, cache)
        return logits, cache, mask, pos

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def example(self, batch, seq_len, seed=0):
        seq_len = min(seq_len or 64, self.max_len)
        return _random_ids(batch, seq_len, self.vocab, seed).to(self.device)

    def forward_example(self, inputs):
        return self.model(input_ids=inputs, use_cache=False).logits

    def pad_to_plan(self, inputs):
        """Right padded with pad tokens, and pad rows: attention is causal, so no real position
        sees a padded one, and `unpad` cuts the padded rows and positions off the logits."""
        n, s = inputs.shape
        batch, length = self.plan.batch(n), self.plan.length(s)
        padded = torch.full((batch, length), self.pad_id, dtype=inputs.dtype, device=inputs.device)
        padded[:n, :s] = inputs
        return padded, batch, length, n * s

    def unpad(self, out, inputs):
        return out[: inputs.shape[0], : inputs.shape[1]]

    def default_seq_len(self):
        return min(64, self.max_len)


def read_model_file(model_dir: str, name: str, catalog: Catalog, entry: Entry) -> str | None:
    """A small text file of the model directory (inside the model roots), or None if absent."""
    if not os.path.lexists(os.path.join(model_dir, name)):
        return None
    with open(safe_file(model_dir, name, catalog, entry), encoding="utf-8") as fh:
        return fh.read()


def prompt_ids(tokenizer, texts: list[str], limit: int, bos_id: int) -> list[list[int]]:
    """Generation prompts as token ids: no special tokens added, the end of a long prompt kept
    (`limit` tokens), an empty one given the BOS token. The torch path and the vLLM engine both
    tokenize here, so the same text is the same prompt on either (greedy parity)."""
    out = []
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids = enc.ids[-limit:] if limit > 0 else []
        out.append(ids or [bos_id])
    return out


def model_chat_template(model_dir: str, catalog: Catalog, entry: Entry) -> ChatTemplate | None:
    """The model's chat template (None: it has none), read from inside the model roots. One
    reading for the torch adapter, the vLLM engine and `describe`, so all three agree on it."""
    return load_chat_template(lambda name: read_model_file(model_dir, name, catalog, entry))


def valid_id(v: Any, vocab: int, default: int | None) -> int | None:
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, int) and 0 <= v < vocab else default

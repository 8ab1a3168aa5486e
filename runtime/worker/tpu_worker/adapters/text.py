"""Text adapters: a sentence-transformer encoder and a causal LM with batched greedy generation."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from ..catalog import Catalog, Entry
from ..errors import Cancelled, WorkerError, invalid
from ..loaders import inside
from ..platforms import platform_for
from .base import Adapter, Output, Prepared, StopFn, seq_bucket


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


def _check_texts(entry: Entry, args: dict) -> list[str]:
    texts = args.get("texts")
    lim = entry.limits
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid(f"model {entry.id!r} needs args.texts: a non-empty list of strings")
    if len(texts) > lim.max_batch:
        raise invalid(f"{len(texts)} texts exceed this model's max_batch of {lim.max_batch}; split the request")
    for i, t in enumerate(texts):
        if len(t) > lim.max_text_chars:
            raise invalid(f"texts[{i}] has {len(t)} characters; the limit is {lim.max_text_chars}")
    return texts


def _seq_len_arg(entry: Entry, args: dict, cap: int) -> int:
    v = args.get("seq_len")
    if v is None:
        return cap
    if not isinstance(v, int) or isinstance(v, bool) or not 2 <= v <= cap:
        raise invalid(f"args.seq_len must be an integer in 2..{cap}")
    return v


def _random_ids(batch: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = min(1000, max(vocab - 1, 1))
    return torch.randint(low, vocab, (batch, seq_len), generator=g)


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
        texts = _check_texts(self.entry, args)
        limit = _seq_len_arg(self.entry, args, self.max_len)
        return Prepared(("embed",), len(texts), self._encode(texts, limit))

    def _pad(self, rows: list[list[int]], length: int) -> dict[str, torch.Tensor]:
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _embed(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(torch.float32)
        # Pool in float32 so bf16/fp16 models lose no extra precision in the reduction.
        summed = (hidden.to(torch.float32) * mask).sum(dim=1)
        pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def run_batch(self, batch, should_stop) -> list[Output]:
        rows = [r for p in batch for r in p.payload]
        length = seq_bucket(max(len(r) for r in rows), self.max_len)
        with torch.no_grad():
            emb = self._embed(self._pad(rows, length)).to("cpu")
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

    def default_seq_len(self):
        return min(128, self.max_len)


class CausalLM(Adapter):
    """Decoder-only LM with batched greedy generation (left padding, KV cache)."""

    architecture = "causal-lm"

    def __init__(self, entry, model, device, dtype, tokenizer, max_len: int) -> None:
        super().__init__(entry, model, device, dtype)
        cfg = model.config
        self.tokenizer = tokenizer
        self.vocab = int(cfg.vocab_size)
        self.n_positions = int(getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 1024))
        self.max_len = min(max_len, self.n_positions)
        self.pad_id = valid_id(cfg.pad_token_id, self.vocab, 0)
        self.eos_id = valid_id(cfg.eos_token_id, self.vocab, None)
        self.bos_id = valid_id(cfg.bos_token_id, self.vocab, self.eos_id if self.eos_id is not None else 0)
        # transformers renamed past_key_values -> cache in 5.x; support both spellings.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def _dynamic(self):
        # The KV cache grows every step: let dynamo mark that dimension dynamic, where the
        # backend allows it (TorchTPU does not: see TpuPlatform.compile_dynamic).
        return platform_for(self.device).compile_dynamic

    def prepare(self, args, tensors) -> Prepared:
        if tensors:
            raise invalid(f"model {self.entry.id!r} takes texts, not tensors")
        texts = _check_texts(self.entry, args)
        lim = self.entry.limits.max_new_tokens
        n = args.get("max_new_tokens", min(16, lim))
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= lim:
            raise invalid(f"args.max_new_tokens must be an integer in 1..{lim}")
        limit = min(_seq_len_arg(self.entry, args, self.max_len), self.n_positions - n)
        prompts = []
        for enc in self.tokenizer.encode_batch(texts, add_special_tokens=False):
            ids = enc.ids[-limit:] if limit > 0 else []  # keep the end of long prompts
            prompts.append(ids or [self.bos_id])
        return Prepared(("generate", n), len(texts), prompts)

    def generate(self, prompts: list[list[int]], max_new: int, should_stop: StopFn) -> tuple[list[list[int]], bool]:
        """Greedy decoding; returns (new token ids per prompt, stopped_early)."""
        b = len(prompts)
        longest = max(len(p) for p in prompts)
        # Bucket the prompt length (left padding) so compiled graphs are reused across requests.
        length = max(longest, seq_bucket(longest, min(self.max_len, self.n_positions - max_new)))
        ids = torch.full((b, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        finished = torch.zeros(b, dtype=torch.bool, device=self.device)
        new: list[torch.Tensor] = []
        stopped = False
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **self._last_only)
            for step in range(max_new):
                nxt = out.logits[:, -1, :].argmax(-1)
                nxt = torch.where(finished, torch.full_like(nxt, self.pad_id), nxt)
                new.append(nxt)
                if self.eos_id is not None:
                    finished |= nxt == self.eos_id
                if step == max_new - 1 or bool(finished.all()):
                    break
                if should_stop():
                    stopped = True
                    break
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=self.device)], dim=1)
                pos = pos[:, -1:] + 1
                cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
                out = self.model(
                    input_ids=nxt[:, None],
                    attention_mask=mask,
                    position_ids=pos,
                    use_cache=True,
                    **{self._cache_kw: cache},
                    **self._last_only,
                )
        tokens = torch.stack(new, dim=1).to("cpu").tolist() if new else [[] for _ in range(b)]
        result = []
        for row in tokens:
            kept = []
            for t in row:
                kept.append(t)
                if t == self.eos_id:
                    break
            result.append(kept)
        return result, stopped

    def run_batch(self, batch, should_stop) -> list[Output]:
        prompts = [r for p in batch for r in p.payload]
        max_new = batch[0].key[1]
        new, stopped = self.generate(prompts, max_new, should_stop)
        if stopped:
            raise Cancelled()
        outs, pos = [], 0
        for p in batch:
            rows = new[pos : pos + p.items]
            pos += p.items
            texts = [self.tokenizer.decode(r, skip_special_tokens=True) for r in rows]
            outs.append(Output({"task": "text-generation", "texts": texts, "new_tokens": [len(r) for r in rows]}, []))
        return outs

    def example(self, batch, seq_len, seed=0):
        seq_len = min(seq_len or 64, self.max_len)
        return _random_ids(batch, seq_len, self.vocab, seed).to(self.device)

    def forward_example(self, inputs):
        return self.model(input_ids=inputs, use_cache=False).logits

    def default_seq_len(self):
        return min(64, self.max_len)


def valid_id(v: Any, vocab: int, default: int | None) -> int | None:
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, int) and 0 <= v < vocab else default

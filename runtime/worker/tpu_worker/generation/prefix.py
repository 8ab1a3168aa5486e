"""A loaded model's cache of prompt-prefix keys and values, so calls that share a prefix (the same
system prompt and tools text) prefill it once.

A prompt is cut into blocks of `block` tokens; block i is keyed by a hash chained over the
partition and every token up to its end, so a block is found only behind the same tokens from
the start of the prompt (its keys and values depend on all of them and on their positions,
which start at 0 in every prompt). Each block keeps its tokens (a lookup compares them, so a hash
collision cannot return someone else's block) and a copy of its per-layer keys and values
[heads, block, dim]. A lookup returns the longest run of cached blocks from the start, leaving at
least one token of the prompt to prefill (its logits choose the first new token).

Bounded in bytes (`max_bytes`, counted in the model's memory pre-flight: memory.py), evicted
least recently used. A chain is touched from its last block to its first, so a prompt's first
blocks are the most recent and a tail is evicted before the blocks it hangs from.

Partitions: every lookup and store names one (the caller's principal key, or one shared key
where the operator allows sharing); a block is never found from another partition. A shared
cache is a timing side channel (a hit answers faster: docs/security.md).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

# block index -> (per-layer keys, per-layer values), each [heads, block, dim]
ReadBlock = Callable[[int], tuple[list[torch.Tensor], list[torch.Tensor]]]


@dataclass
class _Block:
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    nbytes: int


@dataclass
class PrefixStats:
    lookups: int = 0  # prompts looked up
    hits: int = 0  # prompts that found at least one block
    prompt_tokens: int = 0  # tokens of the prompts looked up
    cached_tokens: int = 0  # of those, tokens not prefilled (found in the cache)
    stored_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    def __init__(self, max_bytes: int, block: int) -> None:
        self.max_bytes = max_bytes
        self.block = block
        self.bytes = 0
        self.stats = PrefixStats()
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self._lock = threading.Lock()  # the decode thread writes; status reads

    def _chain(self, partition: str, tokens: list[int], blocks: int) -> list[bytes]:
        """The keys of the first `blocks` blocks of `tokens`."""
        h = hashlib.blake2b(partition.encode("utf-8"), digest_size=16, person=b"tpu-mcp-prefix").digest()
        out = []
        for i in range(blocks):
            chunk = tokens[i * self.block : (i + 1) * self.block]
            data = b"".join(t.to_bytes(4, "little", signed=True) for t in chunk)
            h = hashlib.blake2b(h + data, digest_size=16).digest()
            out.append(h)
        return out

    def _cacheable(self, n: int) -> int:
        """Blocks of a prompt of n tokens that may be cached: all but its last token."""
        return max(n - 1, 0) // self.block

    def lookup(self, partition: str, tokens: list[int]) -> list[_Block]:
        """The cached blocks of `tokens` from its start (possibly none), touched."""
        with self._lock:
            found = []
            for i, key in enumerate(self._chain(partition, tokens, self._cacheable(len(tokens)))):
                b = self._blocks.get(key)
                if b is None or b.tokens != tuple(tokens[i * self.block : (i + 1) * self.block]):
                    break
                found.append((key, b))
            for key, _ in reversed(found):
                self._blocks.move_to_end(key)
            return [b for _, b in found]

    def count(self, prompt_tokens: int, cached_tokens: int) -> None:
        """One prompt joined, `cached_tokens` of its tokens taken from the cache (the hit rate)."""
        with self._lock:
            st = self.stats
            st.lookups += 1
            st.prompt_tokens += prompt_tokens
            st.cached_tokens += cached_tokens
            st.hits += cached_tokens > 0

    def store(self, partition: str, tokens: list[int], read: ReadBlock) -> None:
        """Keeps every cacheable block of `tokens` not kept yet, read (and copied) with `read`."""
        with self._lock:
            keys = self._chain(partition, tokens, self._cacheable(len(tokens)))
            for i, key in enumerate(keys):
                if key in self._blocks:
                    continue
                k, v = read(i)
                nbytes = sum(t.numel() * t.element_size() for t in [*k, *v])
                if nbytes > self.max_bytes:
                    return
                self._evict(self.max_bytes - nbytes)
                chunk = tuple(tokens[i * self.block : (i + 1) * self.block])
                self._blocks[key] = _Block(chunk, [t.clone() for t in k], [t.clone() for t in v], nbytes)
                self.bytes += nbytes
                self.stats.stored_blocks += 1
            for key in reversed(keys):
                if key in self._blocks:
                    self._blocks.move_to_end(key)

    def _evict(self, room: int) -> None:
        while self._blocks and self.bytes > room:
            _, b = self._blocks.popitem(last=False)
            self.bytes -= b.nbytes
            self.stats.evicted_blocks += 1

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.bytes = 0

    def report(self) -> dict:
        with self._lock:
            st = self.stats
            return {
                "enabled": True,
                "block_tokens": self.block,
                "max_bytes": self.max_bytes,
                "bytes": self.bytes,
                "blocks": len(self._blocks),
                "lookups": st.lookups,
                "hits": st.hits,
                "hit_rate": round(st.hits / st.lookups, 4) if st.lookups else None,
                # Prompt tokens served from the cache ÷ prompt tokens looked up.
                "token_hit_rate": round(st.cached_tokens / st.prompt_tokens, 4) if st.prompt_tokens else None,
                "cached_tokens": st.cached_tokens,
                "evicted_blocks": st.evicted_blocks,
            }

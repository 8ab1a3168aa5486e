"""A loaded model's cache of prompt-prefix keys and values, so calls that share a prefix (the same
system prompt and tools text) prefill it once.

A prompt is cut into blocks of `block` tokens; block i is keyed by a hash chained over the
partition and every token up to its end, so a block is found only behind the same tokens from
the start of the prompt (its keys and values depend on all of them and on their positions,
which start at 0 in every prompt). Each block keeps its tokens (a lookup compares them, so a hash
collision cannot return someone else's block) and a copy of its per-layer keys and values
[heads, block, dim]. A lookup returns the longest run of cached blocks from the start, leaving at
least one token of the prompt to prefill (its logits choose the first new token).

Bounded in bytes (`max_bytes`): the blocks live in one pool tensor of `max_bytes // block bytes`
blocks, allocated with the static cache at load (`reserve`), so the memory the pre-flight counts
(memory.py, `pool_bytes`) is held from the load on and a full cache costs no more than its bound
(per-block tensors cost about three times their bytes in a serving worker). Evicted least
recently used. A chain is touched from its last block to its first, so a prompt's first
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


@dataclass(slots=True)
class _Block:
    tokens: bytes  # its tokens as _chain hashes them (a tuple of ints costs ~7x as much)
    pool: torch.Tensor  # the cache's pool: this block is pool[index]
    index: int
    nbytes: int

    # Views made when read (a block is read once per prompt that finds it), not kept: a kept view
    # is a tensor object per layer per block, more than a small model's block bytes.
    @property
    def keys(self) -> list[torch.Tensor]:
        return list(self.pool[self.index, 0].unbind(0))

    @property
    def values(self) -> list[torch.Tensor]:
        return list(self.pool[self.index, 1].unbind(0))


def pool_blocks(max_bytes: int, block: int, layers: int, heads: int, dim: int, itemsize: int) -> int:
    """How many blocks the pool of a `max_bytes` cache holds (keys and values of every layer)."""
    return max_bytes // (2 * layers * heads * block * dim * itemsize)


def pool_bytes(max_bytes: int, block: int, layers: int, heads: int, dim: int, itemsize: int) -> int:
    """The bytes `reserve` allocates for this layout: whole blocks within `max_bytes`."""
    return pool_blocks(max_bytes, block, layers, heads, dim, itemsize) * 2 * layers * heads * block * dim * itemsize


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
        self._pool: torch.Tensor | None = None  # [blocks, 2 (keys, values), layers, heads, block, dim]
        self._free: list[int] = []  # pool indices no block holds
        # Pool indices of blocks a lookup returned since the last `settle`: their callers copy
        # them after later stores, so an evicted one is reused only after the next settle.
        self._lent: set[int] = set()
        self._held: list[int] = []  # evicted while lent

    def reserve(self, layers: int, heads: int, dim: int, dtype: torch.dtype, device) -> None:
        """Allocates the pool (zeroed, so its pages are resident from now on, as the pre-flight
        counts them) for blocks of this layout."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        n = pool_blocks(self.max_bytes, self.block, layers, heads, dim, itemsize)
        with self._lock:
            self._pool = torch.zeros((n, 2, layers, heads, self.block, dim), dtype=dtype, device=device)
            self._free = list(range(n - 1, -1, -1))
            self._blocks.clear()
            self._lent.clear()
            self._held.clear()
            self.bytes = 0

    def settle(self) -> None:
        """The blocks lookups returned are copied (a new admission starts): indices evicted while
        lent become free."""
        with self._lock:
            self._free.extend(self._held)
            self._held.clear()
            self._lent.clear()

    def _chain(self, partition: str, tokens: list[int], blocks: int) -> list[bytes]:
        """The keys of the first `blocks` blocks of `tokens`."""
        h = hashlib.blake2b(partition.encode("utf-8"), digest_size=16, person=b"tpu-mcp-prefix").digest()
        out = []
        for i in range(blocks):
            data = self._tokens(tokens, i)
            h = hashlib.blake2b(h + data, digest_size=16).digest()
            out.append(h)
        return out

    def _tokens(self, tokens: list[int], i: int) -> bytes:
        """Block i's tokens, 4 bytes each."""
        chunk = tokens[i * self.block : (i + 1) * self.block]
        return b"".join(t.to_bytes(4, "little", signed=True) for t in chunk)

    def _cacheable(self, n: int) -> int:
        """Blocks of a prompt of n tokens that may be cached: all but its last token."""
        return max(n - 1, 0) // self.block

    def lookup(self, partition: str, tokens: list[int]) -> list[_Block]:
        """The cached blocks of `tokens` from its start (possibly none), touched."""
        with self._lock:
            found = []
            for i, key in enumerate(self._chain(partition, tokens, self._cacheable(len(tokens)))):
                b = self._blocks.get(key)
                if b is None or b.tokens != self._tokens(tokens, i):
                    break
                found.append((key, b))
            for key, b in reversed(found):
                self._blocks.move_to_end(key)
                self._lent.add(b.index)
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
        """Keeps every cacheable block of `tokens` not kept yet, read (and copied into the pool)
        with `read`. A cache never reserved reserves its pool for the first block's layout."""
        keys = self._chain(partition, tokens, self._cacheable(len(tokens)))
        if keys and self._pool is None:
            k, _ = read(0)
            heads, _, dim = k[0].shape
            self.reserve(len(k), heads, dim, k[0].dtype, k[0].device)
        with self._lock:
            pool = self._pool
            for i, key in enumerate(keys):
                if key in self._blocks:
                    continue
                if not self._free:
                    self._evict_one()
                if not self._free:
                    return  # an empty pool, or every block lent to this admission
                k, v = read(i)
                index = self._free.pop()
                for layer, (kt, vt) in enumerate(zip(k, v, strict=True)):
                    pool[index, 0, layer].copy_(kt)
                    pool[index, 1, layer].copy_(vt)
                nbytes = pool[index].numel() * pool.element_size()
                self._blocks[key] = _Block(self._tokens(tokens, i), pool, index, nbytes)
                self.bytes += nbytes
                self.stats.stored_blocks += 1
            for key in reversed(keys):
                if key in self._blocks:
                    self._blocks.move_to_end(key)

    def _evict_one(self) -> None:
        if self._blocks:
            self._drop(self._blocks.popitem(last=False)[1])
            self.stats.evicted_blocks += 1

    def _drop(self, b: _Block) -> None:
        self.bytes -= b.nbytes
        (self._held if b.index in self._lent else self._free).append(b.index)

    def clear(self) -> None:
        with self._lock:
            for b in self._blocks.values():
                self._drop(b)
            self._blocks.clear()

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

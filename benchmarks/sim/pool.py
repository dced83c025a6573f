"""The simulated device KV pool: fixed-size blocks, a free queue, and (for the policy that models
today's vLLM) the prefix cache.

As vLLM's `BlockPool`: allocation takes blocks from the head of the free queue; a freed request's
blocks go to its tail in reverse order (its last block is reused first, its prefix survives longest);
with prefix caching a full computed block keeps its hash while free, so the same context asking again
(a discarded pause's resume, a preempted request) hits it, until the block is reallocated, and a freed
block without a hash (a partly filled last block) goes to the head instead, to be reused first
(`BlockPool.free_blocks`: LIFO for uncached blocks, FIFO for cached ones). Contexts
here are never shared between requests (the workload's prompts are unique), so a block's hash is
simply (its request, its index)."""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV pool needs at least one block of at least one token")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        # Without prefix caching the order of free blocks does not matter: a stack is fastest.
        # (Only the structure in use is built: the bound's pool may hold millions of blocks.)
        self._stack: list[int] = [] if prefix_caching else list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks)) if prefix_caching else OrderedDict()
        self._key_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}

    def num_free(self) -> int:
        return len(self._lru) if self.prefix_caching else len(self._stack)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free():
            raise AssertionError(f"allocating {n} blocks with {self.num_free()} free")
        if not self.prefix_caching:
            out = self._stack[len(self._stack) - n:]
            del self._stack[len(self._stack) - n:]
            return out
        out = []
        for _ in range(n):
            b, _ = self._lru.popitem(last=False)
            key = self._key_of.pop(b, None)
            if key is not None:
                del self._block_of[key]  # evicted from the prefix cache
            out.append(b)
        return out

    def free(self, blocks: list[int]) -> None:
        if not self.prefix_caching:
            self._stack.extend(blocks)
            return
        first = []
        for b in reversed(blocks):
            if b in self._key_of:
                self._lru[b] = None
            else:
                first.append(b)
        for b in reversed(first):  # prepended in order: the first of them ends at the head
            self._lru[b] = None
            self._lru.move_to_end(b, last=False)

    # ------------------------------------------------------------------ prefix cache
    def register(self, block: int, key: int) -> None:
        if self.prefix_caching:
            self._key_of[block] = key
            self._block_of[key] = block

    def find_hits(self, keys: range) -> list[int]:
        """The blocks of the longest run of leading keys still cached (they stay free until `touch`)."""
        hits = []
        if self.prefix_caching:
            for key in keys:
                b = self._block_of.get(key)
                if b is None or b not in self._lru:
                    break
                hits.append(b)
        return hits

    def touch(self, blocks: list[int]) -> None:
        """Hit blocks become the request's again: out of the free queue, still cached."""
        for b in blocks:
            del self._lru[b]

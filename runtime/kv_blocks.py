"""The paged K/V cache's bookkeeping: which blocks hold which sequence's positions, and which full
blocks can be shared.

A block holds PAGE consecutive positions of every layer's K and V (the cache is [layers, 2, blocks,
PAGE, kv features]). A sequence owns a list of blocks, its page table row. Blocks are reference
counted: a full block is named by the hash of its tokens and of everything before them, so a second
sequence with the same prefix (a shared system prompt, or a preempted sequence coming back) takes
the same blocks instead of recomputing them. A block whose count drops to zero stays cached until it
is needed for something else (least recently freed first); it counts as free.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass


def block_hashes(tokens: list[int], page: int) -> list[bytes]:
    """The chain hash of every full block of `tokens`: block i's hash covers tokens [0, (i + 1) * page)."""
    out, h = [], b""
    for i in range(len(tokens) // page):
        h = hashlib.blake2b(h + repr(tokens[i * page:(i + 1) * page]).encode(), digest_size=16).digest()
        out.append(h)
    return out


@dataclass
class PoolStats:
    total: int
    free: int
    cached: int  # free blocks that still hold a reusable prefix


class BlockPool:
    def __init__(self, total: int, page: int):
        if total < 1:
            raise ValueError(f"a K/V pool needs at least one block, got {total}")
        self.total, self.page = total, page
        self.refs = [0] * total
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._plain = list(range(total - 1, -1, -1))  # free blocks caching nothing (a stack)
        self._cached: OrderedDict[int, None] = OrderedDict()  # free blocks caching a prefix, oldest first

    @property
    def free_blocks(self) -> int:
        return len(self._plain) + len(self._cached)

    def stats(self) -> PoolStats:
        return PoolStats(self.total, self.free_blocks, len(self._cached))

    def cached_prefix(self, hashes: list[bytes]) -> list[int]:
        """The blocks holding the longest prefix of these block hashes."""
        out = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def take(self, blocks: list[int]) -> None:
        """Share blocks from cached_prefix with one more sequence."""
        for b in blocks:
            if self.refs[b] == 0:
                del self._cached[b]
            self.refs[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """n blocks for new positions (blocks caching nothing first, then the least recently freed
        cached ones, which forget their prefix), or None when fewer than n are free."""
        if n > self.free_blocks:
            return None
        out = []
        for _ in range(n):
            if self._plain:
                b = self._plain.pop()
            else:
                b, _ = self._cached.popitem(last=False)
                del self._block_of[self._hash_of.pop(b)]
            self.refs[b] = 1
            out.append(b)
        return out

    def publish(self, block: int, h: bytes) -> None:
        """Block `block` now holds the full block named `h`: later sequences may share it."""
        if block in self._hash_of or h in self._block_of:
            return  # already named, or another block holds the same tokens
        self._hash_of[block] = h
        self._block_of[h] = block

    def release(self, blocks: list[int]) -> None:
        """One sequence lets go of its blocks (finish, cancel, preemption)."""
        for b in blocks:
            if self.refs[b] <= 0:
                raise AssertionError(f"block {b} released more often than taken")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self._hash_of:
                    self._cached[b] = None
                else:
                    self._plain.append(b)

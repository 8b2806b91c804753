"""Which rows each engine step computes, and the K/V blocks behind them.

A sequence is its tokens (prompt, then generated) and how many of them the cache holds (`computed`).
Every step computes, for each running sequence, the next of its tokens: a prefill piece when more
than one is missing (pieces of several sequences share one chunk of `chunk` rows), a decode row when
one is (all of them in one batched step). Because a row's result never depends on the rows beside
it, none of this changes a sequence's tokens: not the batching, not the chunking, not a preemption.

Admission is first come, first served: the oldest waiting sequence starts when a batch slot is free
and the blocks its uncached tokens need, plus one block of decode headroom, are free; blocks whose
tokens another sequence already computed are shared instead (kv_blocks.BlockPool). When a decode row
needs a new block and none is free, the newest running sequence is preempted: its blocks are released
(its full blocks stay cached, so coming back is usually cheap) and it waits at the head of the queue
to be recomputed from its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .kv_blocks import BlockPool, block_hashes


@dataclass(eq=False)
class Sequence:
    id: int
    tokens: list[int]
    limit: int  # tokens it may reach: prompt + max_tokens, at most the context
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    published: int = 0  # leading full blocks named in the pool
    admitted: int = -1  # admission order (the newest is preempted first); -1 while waiting
    preemptions: int = 0
    cached_tokens: int = 0  # prompt positions taken from shared blocks at first admission
    state: Any = None  # the engine's per-request state (sampler, text, timings)

    @property
    def missing(self) -> int:
        return len(self.tokens) - self.computed


@dataclass
class Step:
    prefill: list[tuple[Sequence, int]]  # (sequence, rows from its `computed`)
    decode: list[Sequence]
    admitted: list[int]
    preempted: list[int]
    refused: list[tuple[Sequence, str]]  # sequences that can never run, and why


class Scheduler:
    def __init__(self, pool: BlockPool, max_seqs: int, chunk: int):
        self.pool, self.max_seqs, self.chunk = pool, max_seqs, chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self._admissions = 0

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """A finished or cancelled sequence leaves, returning its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []

    def schedule(self) -> Step:
        step = Step([], [], [], [], [])
        self._admit(step)
        budget = self.chunk
        for seq in self.running:
            if seq.missing > 1 and budget:
                n = min(seq.missing, budget)
                step.prefill.append((seq, n))
                budget -= n
        for seq in list(self.running):
            if seq.missing == 1 and seq in self.running and self._room_for_next(seq, step):
                step.decode.append(seq)
        return step

    def done(self, seq: Sequence, rows: int, known: int | None = None) -> None:
        """A step computed (or queued) `rows` more of seq's tokens; name the blocks that became full.
        `known`: how many of seq's tokens are known yet (a pipelined step's input may still be on the
        device); only blocks of known tokens are named, the rest by a later publish()."""
        seq.computed += rows
        self.publish(seq, len(seq.tokens) if known is None else known)

    def publish(self, seq: Sequence, known: int) -> None:
        """Name seq's full blocks among its first min(computed, known) positions, for sharing."""
        full = min(seq.computed, known) // self.pool.page
        if full > seq.published:
            for i, h in enumerate(block_hashes(seq.tokens[:full * self.pool.page], self.pool.page)[seq.published:],
                                  seq.published):
                self.pool.publish(seq.blocks[i], h)
            seq.published = full

    def reserve(self, seq: Sequence, n: int) -> int:
        """Blocks for seq's next n positions, as far as free blocks go (nobody is preempted for them): how
        many of those positions have one."""
        while self._blocks_for(seq.computed + n) > len(seq.blocks):
            got = self.pool.allocate(1)
            if got is None:
                break
            seq.blocks += got
        return max(0, min(n, len(seq.blocks) * self.pool.page - seq.computed))

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.page)

    def _admit(self, step: Step) -> None:
        while self.waiting and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            if self._blocks_for(len(seq.tokens)) + 1 > self.pool.total:
                self.waiting.popleft()
                step.refused.append((seq, f"its {len(seq.tokens)} tokens need {self._blocks_for(len(seq.tokens))} "
                                          f"K/V blocks and one of headroom; the pool has {self.pool.total}"))
                continue
            # reuse full blocks of the prefix, but leave the last token to compute: its row gives the output
            page = self.pool.page
            shared = self.pool.cached_prefix(block_hashes(seq.tokens[:(len(seq.tokens) - 1) // page * page], page))
            fresh = self._blocks_for(len(seq.tokens)) - len(shared)
            if fresh + 1 > self.pool.free_blocks - sum(1 for b in shared if self.pool.refs[b] == 0):
                return
            self.waiting.popleft()
            self.pool.take(shared)
            seq.blocks = shared + self.pool.allocate(fresh)
            seq.computed, seq.published = len(shared) * page, len(shared)
            if seq.admitted < 0:
                seq.cached_tokens = seq.computed
            seq.admitted = self._admissions
            self._admissions += 1
            self.running.append(seq)
            step.admitted.append(seq.id)

    def _room_for_next(self, seq: Sequence, step: Step) -> bool:
        """Make sure seq has a block for its next position, preempting the newest others if needed;
        False if seq itself had to go."""
        while not self.reserve(seq, 1):
            victim = max(self.running, key=lambda s: s.admitted)
            self._preempt(victim, step)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, step: Step) -> None:
        self.running.remove(seq)
        step.prefill[:] = [(s, n) for s, n in step.prefill if s is not seq]
        if seq in step.decode:
            step.decode.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.computed, seq.published = [], 0, 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        step.preempted.append(seq.id)

"""Scoring a text in windows of the context, as llama-perplexity does, through an engine's prefill.

The text's tokens are cut into windows of `ctx` tokens. By default the windows do not overlap, each
starts with BOS in place of its first token (when the model adds one), and each scores the second
half of its predictions: row j of a window predicts its token j + 1, for j from ctx / 2 to ctx - 2.
With a stride S (llama-perplexity --ppl-stride), windows start every S tokens, keep their tokens as
they are, and each scores its last S predictions. A window's last token predicts nothing scored, so
it is not computed.

`score` packs the windows' rows into prefill steps within the plan's bounds (chunk rows a step; the
scored rows of a step leave the step as logits rows, through the prefill's `last` input, whose
length the plan bounds by max_seqs) and gives each step's logits rows to its caller. Rows never
depend on the rows beside them in a step, so the packing changes no number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from llmplan.core.errors import InputError
from llmplan.core.numerics import pages_for


@dataclass(frozen=True)
class Window:
    start: int  # where its first token sits in the text's tokens
    tokens: list[int]  # the tokens it evaluates (its last one is only a target)
    first: int  # the first scored row: rows first .. len(tokens) - 2 predict tokens[row + 1]

    @property
    def rows(self) -> int:
        """Rows computed: every token but the last."""
        return len(self.tokens) - 1

    @property
    def scored(self) -> int:
        return self.rows - self.first

    @property
    def targets(self) -> list[int]:
        return self.tokens[self.first + 1:]


def windows(ids: list[int], ctx: int, stride: int | None, bos: int | None) -> list[Window]:
    """llama-perplexity's windows over `ids` (the whole text, tokenized with BOS where the model adds
    one): without a stride, len(ids) // ctx windows that start with `bos`; with one, every window
    that fits, `stride` tokens apart."""
    if ctx < 4:
        raise InputError(f"--ctx {ctx}: a window needs at least 4 tokens")
    if stride is None:
        if len(ids) < 2 * ctx:  # llama-perplexity's own minimum
            raise InputError(f"the text has {len(ids)} tokens; windows of {ctx} need at least {2 * ctx}: "
                             "give a longer text or a smaller --ctx")
        out = []
        for start in range(0, len(ids) // ctx * ctx, ctx):
            tokens = ids[start:start + ctx]
            out.append(Window(start, ([bos] if bos is not None else tokens[:1]) + tokens[1:], ctx // 2))
        return out
    if not 1 <= stride < ctx:
        raise InputError(f"--stride {stride} must be between 1 and --ctx - 1 ({ctx - 1})")
    if len(ids) <= ctx:
        raise InputError(f"the text has {len(ids)} tokens; a window of {ctx} with a stride needs more")
    n = (len(ids) - ctx + stride - 1) // stride
    return [Window(i * stride, ids[i * stride:i * stride + ctx], ctx - stride - 1) for i in range(n)]


@dataclass
class Scored:
    """One step's scored rows: `index` numbers them across all windows (window by window, row by
    row), `targets` are the tokens they predict, `logits` their rows (valid until the next step)."""

    index: np.ndarray
    targets: np.ndarray
    logits: np.ndarray


@dataclass
class _Open:
    window: Window
    blocks: list[int]
    base: int  # the index of its first scored row
    done: int = 0  # rows computed


def kv_blocks_needed(chunk: int, ctx: int) -> int:
    """K/V blocks for every window a step of `chunk` rows can touch, plus one block of headroom."""
    return (chunk // (ctx - 1) + 2) * pages_for(ctx - 1) + 1


def score(engine, wins: list[Window]) -> Iterator[Scored]:
    """Run every window through `engine`'s prefill; yield each step's scored rows."""
    limits = engine.limits
    ctx = max((len(w.tokens) for w in wins), default=0)
    if ctx > limits.ctx:
        raise InputError(f"windows of {ctx} tokens do not fit the plan's context of {limits.ctx}: pass a "
                         f"smaller --ctx or compile with --ctx {ctx}")
    width = pages_for(limits.ctx)
    chunk, bound = limits.chunk, limits.max_seqs  # rows a step; its scored rows and sequences
    pending = list(reversed(wins))
    bases = np.cumsum([0] + [w.scored for w in wins])
    opened: list[_Open] = []
    while pending or opened:
        pieces: list[tuple[_Open, int]] = []  # (window, rows from its `done`)
        rows = scored = 0
        k = 0
        while rows < chunk and scored < bound and len(pieces) < bound:
            if k == len(opened):
                if not pending:
                    break
                blocks = engine.pool.allocate(pages_for(pending[-1].rows))
                if blocks is None:
                    break
                w = pending.pop()
                opened.append(_Open(w, blocks, int(bases[len(wins) - len(pending) - 1])))
            o = opened[k]
            n = min(o.window.rows - o.done, chunk - rows)
            n = min(n, max(o.window.first, o.done) + bound - scored - o.done)  # scored rows within the bound
            pieces.append((o, n))
            rows += n
            scored += _scored_in(o, n)
            k += 1
        if not pieces:
            raise InputError(f"the K/V pool ({engine.pool.total} blocks) cannot hold one window of {ctx} tokens")
        yield from _step(engine, pieces, width)
        for o, n in pieces:
            o.done += n
            if o.done == o.window.rows:
                engine.pool.release(o.blocks)
                opened.remove(o)


def _scored_in(o: _Open, n: int) -> int:
    return max(0, o.done + n - max(o.window.first, o.done))


def _step(engine, pieces: list[tuple[_Open, int]], width: int) -> Iterator[Scored]:
    tokens, pos, seq, last, index, targets = [], [], [], [], [], []
    for j, (o, n) in enumerate(pieces):
        w, lo = o.window, o.done
        for r in range(max(w.first, lo), lo + n):
            last.append(len(tokens) + r - lo)
            index.append(o.base + r - w.first)
            targets.append(w.tokens[r + 1])
        tokens += w.tokens[lo:lo + n]
        pos += range(lo, lo + n)
        seq += [j] * n
    # the plan binds one `seqs` for the page table's rows and for `last`: pad both to the larger
    seqs = max(len(pieces), len(last))
    pages = np.zeros((seqs, width), np.int32)
    for j, (o, _) in enumerate(pieces):
        pages[j, :len(o.blocks)] = o.blocks
    state = {"tokens": np.asarray(tokens, np.int32), "pos": np.asarray(pos, np.int32),
             "seq": np.asarray(seq, np.int32), "pages": pages,
             "last": np.asarray(last + [0] * (seqs - len(last)), np.int32)}
    out = engine.executor.run("prefill", state, {"cache", "logits"} if last else {"cache"})
    if last:
        yield Scored(np.asarray(index, np.int64), np.asarray(targets, np.int32), out["logits"][:len(last)])

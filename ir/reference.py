"""One sequence through the reference interpreter: prefill a prompt, then decode token by token."""

from __future__ import annotations

import numpy as np

from llmplan.core.numerics import EVERY_TOKEN, PAGE, pages_for

from .graph import Graph
from .interpret import Interpreter, WeightFn


class ReferenceDecoder:
    """Holds the K/V cache of a single sequence across a prefill graph and a decode graph: its pages are
    the cache's blocks in order."""

    def __init__(self, prefill: Graph, decode: Graph, weight: WeightFn, ctx: int):
        self._prefill = Interpreter(prefill, weight)
        self._decode = Interpreter(decode, weight)
        t = next(n.types[0] for n in prefill.inputs if n.name == "cache")
        blocks = pages_for(ctx)
        self.cache = np.zeros((t.shape[0], 2, blocks, PAGE, t.shape[4]), np.float16)
        self.pages = np.arange(blocks, dtype=np.int32)[None, :]
        self.ctx, self.n_past = ctx, 0
        # a fused graph's tail takes token masks (one sequence: one row): every token allowed, as the
        # unfused graph's argmax
        self._masks = {id(g): np.full((1, m.types[0].shape[1]), EVERY_TOKEN, np.int32) for g in (prefill, decode)
                       for m in g.inputs if m.name == "mask"}

    def _mask(self, g: Graph) -> dict[str, np.ndarray]:
        return {"mask": self._masks[id(g)]} if id(g) in self._masks else {}

    def _positions(self, n: int) -> np.ndarray:
        if self.n_past + n > self.ctx:
            raise ValueError(f"{self.n_past + n} tokens exceed the context of {self.ctx}")
        pos = np.arange(self.n_past, self.n_past + n, dtype=np.int32)
        self.n_past += n
        return pos

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Logits after the last token of `ids` (one chunk)."""
        n = len(ids)
        out = self._prefill.run({"tokens": np.asarray(ids, np.int32), "pos": self._positions(n),
                                 "seq": np.zeros(n, np.int32), "pages": self.pages,
                                 "last": np.array([n - 1], np.int32), "cache": self.cache}
                                | self._mask(self._prefill.graph))
        self.cache = out["cache"]
        return out["logits"][0]

    def step(self, token: int) -> np.ndarray:
        out = self._decode.run({"tokens": np.array([token], np.int32), "pos": self._positions(1),
                                "seq": np.zeros(1, np.int32), "pages": self.pages, "cache": self.cache}
                               | self._mask(self._decode.graph))
        self.cache = out["cache"]
        return out["logits"][0]

    def greedy(self, prompt: list[int], n: int, stop: frozenset[int] = frozenset()) -> tuple[np.ndarray, list[int]]:
        """The logits after the prompt and up to `n` greedy tokens (ending early after a stop token)."""
        logits = first = self.prefill(prompt)
        ids: list[int] = []
        while len(ids) < n:
            ids.append(int(np.argmax(logits)))
            if ids[-1] in stop or len(ids) == n:
                break
            logits = self.step(ids[-1])
        return first, ids

"""Large lists of strings without a Python object per string: a vocabulary's 262144 tokens.

As Python strs and a str -> id dict, Gemma 3's vocabulary costs about 37 MiB; as one UTF-8 blob with an
offsets array it is 4 MiB, and the lookup by text (hashes sorted, with their positions) 4 MiB more.
Items are decoded when asked for: the tokenizer asks for few of them.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Iterator, Sequence

import numpy as np


class StringArray(Sequence[str]):
    """Strings held as one UTF-8 blob: string i is blob[offsets[i]:offsets[i + 1]]."""

    def __init__(self, blob: bytes, offsets: np.ndarray):
        self.blob = blob
        self.offsets = offsets  # int64, n + 1 ascending positions from 0 to len(blob)
        self._at = memoryview(offsets)  # indexing it gives plain ints, several times faster than NumPy scalars

    @classmethod
    def of(cls, strings: Iterable[str]) -> StringArray:
        raw = [s.encode() for s in strings]
        offsets = np.zeros(len(raw) + 1, np.int64)
        np.cumsum([len(r) for r in raw], out=offsets[1:])
        return cls(b"".join(raw), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, i: int) -> bytes:
        """String i's UTF-8 bytes."""
        i = operator.index(i)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"string {i} of {n}")
        i %= n
        return self.blob[self._at[i] : self._at[i + 1]]

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # no slices: nothing needs them
        return self.raw(i).decode()

    def iter_raw(self) -> Iterator[bytes]:
        blob, ends = self.blob, self._at
        start = 0
        for end in ends[1:]:
            yield blob[start:end]
            start = end

    def __iter__(self) -> Iterator[str]:
        return (b.decode() for b in self.iter_raw())

    @property
    def lengths(self) -> np.ndarray:
        """Every string's length in bytes."""
        return np.diff(self.offsets)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.blob == other.blob and np.array_equal(self.offsets, other.offsets)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"


class StringIndex:
    """Position by text in a StringArray, as a dict built from it would give it: a text that occurs
    more than once maps to its last position. The strings' hashes are kept sorted, with their
    positions; a lookup bisects them and compares the few strings whose hash matches."""

    def __init__(self, strings: StringArray):
        self._strings = strings
        hashes = np.fromiter(map(hash, strings.iter_raw()), np.int64, len(strings))
        order = np.argsort(hashes, kind="stable")  # equal hashes keep position order
        self._hashes, self._order = memoryview(hashes[order]), memoryview(order)  # plain ints, as StringArray's
        self._offsets = memoryview(strings.offsets)

    def get(self, text: str, default: int | None = None) -> int | None:
        raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate matches nothing, as in a dict
        h = hash(raw)
        hashes, order, offsets, blob = self._hashes, self._order, self._offsets, self._strings.blob
        found = default
        k = bisect.bisect_left(hashes, h)
        while k < len(hashes) and hashes[k] == h:  # positions ascending: the last match wins
            i = order[k]
            if blob[offsets[i] : offsets[i + 1]] == raw:
                found = i
            k += 1
        return found

    def __getitem__(self, text: str) -> int:
        i = self.get(text)
        if i is None:
            raise KeyError(text)
        return i

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def shadowed(self) -> list[int]:
        """The positions a lookup never gives: those whose text occurs again later."""
        hashes, order = np.asarray(self._hashes), np.asarray(self._order)
        same = np.flatnonzero(hashes[1:] == hashes[:-1])
        candidates = np.unique(order[np.concatenate([same, same + 1])])
        return [int(i) for i in candidates if self.get(self._strings[int(i)]) != i]

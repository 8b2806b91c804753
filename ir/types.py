"""Value types: an element type and a shape whose dimensions are ints or symbolic names.

Element types are the activation dtypes (f32, f16, i32) or, for weights, a weight format in lower
case (q4_k, q8_0, ...). Shapes are in NumPy order, so a weight that maps `in` features to `out`
features has shape [out, in]. Symbolic dimensions (`rows`, `seqs`, `slots`, `ctx`) are bound only
when a graph runs; two symbolic dimensions are equal when their names are.
"""

from __future__ import annotations

from dataclasses import dataclass

Dim = int | str


@dataclass(frozen=True)
class Type:
    dtype: str
    shape: tuple[Dim, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, *shape: Dim) -> Type:
        return Type(self.dtype, tuple(shape))

    def with_dtype(self, dtype: str) -> Type:
        return Type(dtype, self.shape)


def parse_type(text: str) -> Type:
    """Inverse of str(Type): 'f32[rows, 4096]'."""
    text = text.strip()
    if not text.endswith("]") or "[" not in text:
        raise ValueError(f"not a type: {text!r}")
    dtype, dims = text[:-1].split("[", 1)
    shape = tuple(int(d) if d.strip().lstrip("-").isdigit() else d.strip() for d in dims.split(",") if d.strip())
    return Type(dtype.strip(), shape)

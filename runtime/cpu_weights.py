"""Weight residency on the CPU backend, as the plan says: projections dequantized to float32 once at
load, the embedding table left quantized in the mapped file (rows dequantized per step)."""

from __future__ import annotations

import numpy as np

from llmplan.core.formats import dequantize, format_of
from llmplan.models.gguf import GGUFFile

from .cpu_kernels import MappedRows


class CpuWeights:
    def __init__(self, f: GGUFFile, residency: dict[str, dict[str, str]]):
        self.f32: dict[str, np.ndarray] = {}
        self.rows: dict[str, MappedRows] = {}
        for name, ways in residency.items():
            t = f.tensors[name]
            if "rows" in ways:
                self.rows[name] = MappedRows(f.tensor_bytes(name), t.type.name, t.row_bytes)
            if "matmul" in ways or "vector" in ways:
                self.f32[name] = dequantize(f.tensor_bytes(name), t.type, t.shape[::-1])
                format_of(t.type)  # an unsupported format fails here, at load, with its name

    @property
    def unpacked_bytes(self) -> int:
        """Memory the backend holds beyond the mapped file."""
        return sum(a.nbytes for a in self.f32.values())

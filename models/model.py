"""A model file opened for use: validated GGUF + ModelConfig + every tensor bound by name and shape."""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmplan.core.errors import FormatError
from llmplan.core.formats import dequantize, format_of

from .architectures import definition
from .config import ModelConfig, config_from_gguf
from .errors import ConfigError
from .gguf import GGUFFile, TensorInfo
from .tensor_table import expected_tensors
from .vocab import check_tokenizer


def bind_tensors(f: GGUFFile, c: ModelConfig) -> dict[str, TensorInfo]:
    """Check the tensor table against the architecture: nothing missing, nothing extra, shapes and
    formats as the config implies."""
    want = expected_tensors(c)
    missing = [n for n in want if n not in f.tensors]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConfigError(f"{f.path}: missing tensor {missing[0]} (shape {want[missing[0]]}){more}")
    extra = [n for n in f.tensors if n not in want]
    if extra:
        raise ConfigError(f"{f.path}: unexpected tensor {extra[0]} for architecture {c.arch}")
    for name, shape in want.items():
        t = f.tensors[name]
        if t.shape != shape:
            raise ConfigError(f"{f.path}: tensor {name} has shape {t.shape}, the config implies {shape}")
        try:
            format_of(t.type)
        except FormatError as e:
            raise FormatError(f"{f.path}: tensor {name}: {e}") from None
    return {n: f.tensors[n] for n in want}


@dataclass
class Model:
    path: str
    file: GGUFFile
    config: ModelConfig
    weights: dict[str, TensorInfo]

    def dequantize(self, name: str):
        """One weight (a tensor, or a view of its rows) as float32 in NumPy order (rows first): [out, in]
        for a matrix."""
        t = self.file.weight(name)
        return dequantize(self.file.tensor_bytes(name), t.type, t.shape[::-1])

    @property
    def definition(self):
        """The architecture's model definition, which ir/trace.py's tracer calls."""
        return definition(self.config.arch)

    def weight_table(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Tensor name -> (format name, shape in NumPy order: rows first), what the tracer types weights by."""
        return {n: (t.type.name, t.shape[::-1]) for n, t in self.weights.items()}


def open_model(path: str | os.PathLike) -> Model:
    """Open, validate and bind a model file; weights stay memory-mapped in the file."""
    f = GGUFFile(path)
    c = config_from_gguf(f)
    model = Model(f.path, f, c, bind_tensors(f, c))
    check_tokenizer(f)
    return model

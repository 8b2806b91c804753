"""The model definition of each supported architecture (the tracer looks them up here)."""

from __future__ import annotations

from typing import Callable

from . import gemma3, llama
from .config import SUPPORTED_ARCHITECTURES
from .errors import ConfigError

# the Llama family's variants are switches of one definition (models/llama.py)
DEFINITIONS: dict[str, Callable] = {"llama": llama.decoder, "qwen2": llama.decoder, "qwen3": llama.decoder,
                                    "phi3": llama.decoder, "qwen3moe": llama.decoder, "gemma3": gemma3.decoder}
assert set(DEFINITIONS) == set(SUPPORTED_ARCHITECTURES)


def definition(arch: str) -> Callable:
    if arch not in DEFINITIONS:
        raise ConfigError(f"architecture '{arch}' is not supported (supported: {', '.join(DEFINITIONS)})")
    return DEFINITIONS[arch]

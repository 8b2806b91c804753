"""Which llmplan code is this: a hash of the package's source files (every subpackage folder's Python,
C++, CUDA and HIP sources), so that two installs with one id run the same code, and what was made by
other code (a plan `plan run` compiled on the fly) is told apart."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # where the subpackages' folders sit side by side
SOURCES = ("*.py", "*.h", "*.cuh", "*.cu")


@functools.cache
def build_id() -> str:
    h = hashlib.sha256()
    for init in sorted(PACKAGE_ROOT.glob("*/__init__.py")):
        for path in sorted(p for pattern in SOURCES for p in init.parent.rglob(pattern)):
            h.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]

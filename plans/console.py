"""What the CLI verbs share: JSON for scripts, aligned tables for people, and the flags of every verb
that runs an engine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable, Sequence


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned text columns, numbers right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    cols = [list(header)] + rows
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    numeric = [all(_is_number(r[i]) for r in rows) and rows for i in range(len(header))]
    out = []
    for r in cols:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _is_number(s: str) -> bool:
    return s.replace(",", "").replace(".", "", 1).lstrip("-").isdigit()


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def add_threads(p: argparse.ArgumentParser) -> None:
    """--threads: the cpu driver's thread pool (and the emulated GPU's threads)."""
    p.add_argument("--threads", type=int, metavar="N",
                   help="host threads the kernels run on (default: every core this process may use)")

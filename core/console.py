"""What the CLI verbs share: JSON for scripts, aligned tables for people, and the flags of every verb
that runs an engine."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, Iterable, Iterator, Sequence


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


def plural(n: int, one: str, many: str = "") -> str:
    """'1 tensor', '2 tensors'; `many` where adding an s is not the plural."""
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


class Progress:
    """Where a long command is, on stderr: on a terminal each phase's line shows it running, then its
    time; elsewhere (a log, a pipe) one line as each phase starts, so a log says what is running now."""

    def __init__(self, prefix: str, stream: Any = None):
        self.prefix, self.stream = prefix, stream or sys.stderr
        self.tty = self.stream.isatty()

    def note(self, text: str) -> None:
        self.stream.write(f"{self.prefix}: {text}\n")
        self.stream.flush()

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self.stream.write(f"{self.prefix}: {what}" + (" ..." if self.tty else "\n"))
        self.stream.flush()
        try:
            yield
        finally:
            if self.tty:  # a probe's progress bar may have drawn over the line: draw it whole
                self.stream.write(f"\r\x1b[K{self.prefix}: {what} ({time.perf_counter() - t0:.1f} s)\n")
                self.stream.flush()


def add_threads(p: argparse.ArgumentParser) -> None:
    """--threads: the cpu driver's thread pool (and the emulated GPU's threads)."""
    p.add_argument("--threads", type=int, metavar="N",
                   help="host threads the kernels run on (default: every core this process may use)")

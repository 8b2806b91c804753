"""A weight that is a range of rows of a file tensor: how projections stored fused in the file (Phi-3's
attn_qkv, its gate|up ffn_up) are read as the separate projections they stand for. The view is named
`tensor[lo:hi]`; every stage treats it as a weight of its own (a row-major tensor's rows lo..hi are
one contiguous byte range, in every format), and the GGUF reader finds its bytes."""

from __future__ import annotations

import re

_VIEW = re.compile(r"(?P<tensor>.+)\[(?P<lo>\d+):(?P<hi>\d+)\]")


def view_name(tensor: str, lo: int, hi: int) -> str:
    if not 0 <= lo < hi:
        raise ValueError(f"rows {lo}:{hi} of {tensor} are not a range")
    return f"{tensor}[{lo}:{hi}]"


def parse_view(name: str) -> tuple[str, int, int] | None:
    """(tensor, lo, hi) of a view's name, None for a whole tensor's."""
    m = _VIEW.fullmatch(name)
    return (m["tensor"], int(m["lo"]), int(m["hi"])) if m else None

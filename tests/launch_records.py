"""Plan records for the kernel-family tests, written in the wire form plan files store ({"buf": 0},
{"weight": name, "layout": L}, ...): a launch as plans/lower.py makes one, its phase's buffers, and the
wire form of what a family returns, for comparing against literals."""

from __future__ import annotations

from typing import Any

from llmplan.core.op_traits import TRAITS
from llmplan.core.plan_records import Buffer, Launch, record_from_wire, ref_to_wire


def lowered(wire: dict[str, Any]) -> Launch:
    """A lowered launch from its wire form (a None field left out); the family is the op's
    (core/op_traits.py) unless given."""
    given = {k: v for k, v in wire.items() if v is not None}
    return record_from_wire(Launch, {"family": TRAITS[wire["op"]].family, "attrs": {}, "outs": []} | given, "launch")


def phase_buffers(specs: list[dict[str, Any]]) -> list[Buffer]:
    """A phase's buffers from {"dtype", "shape"} maps."""
    return [Buffer(s["dtype"], tuple(s["shape"])) for s in specs]


def wire(refs) -> list[dict[str, Any]]:
    """Argument references as plan files store them."""
    return [ref_to_wire(r) for r in refs]

"""Buffer planning: no two buffers alive at once share a byte, and the arena holds one layer's
activations however deep the model."""

import itertools

import pytest

from llmplan.core.devices import local_cpu
from llmplan.core.plan_records import to_wire
from llmplan.core.planfile import read_body, read_header
from llmplan.models.builder import plan_build
from llmplan.models.model import open_model
from llmplan.plans.buffers import ALIGN, Interval, place
from llmplan.plans.compile import compile_model


def test_place_keeps_live_buffers_apart_and_reuses_dead_ones():
    bufs = [Interval(0, 1000, 0, 2), Interval(1, 300, 1, 3), Interval(2, 1000, 3, 4), Interval(3, 10, 4, 5)]
    offsets, size = place(bufs)
    sizes = {b.id: -(-b.bytes // ALIGN) * ALIGN for b in bufs}
    for a, b in itertools.combinations(bufs, 2):
        if a.first <= b.last and b.first <= a.last:
            assert offsets[a.id] + sizes[a.id] <= offsets[b.id] or offsets[b.id] + sizes[b.id] <= offsets[a.id]
    assert all(o % ALIGN == 0 for o in offsets.values())
    assert offsets[2] == offsets[0] == 0  # the second 1000-byte buffer takes the first one's place
    assert size == 1024 + 512


def _compiled(tmp_path, layers):
    b = plan_build(tmp_path / f"m{layers}.gguf", "tiny-llama", overrides={"n_layers": str(layers)})
    b.write(progress=False)
    out = tmp_path / f"m{layers}.plan"
    compile_model(open_model(b.writer.path), local_cpu(), out, ctx=512, chunk=64)
    header, offset = read_header(out)
    return to_wire(read_body(out, offset))  # as the file holds it


def test_arena_is_one_layer_deep(tmp_path):
    shallow, deep = _compiled(tmp_path, 2), _compiled(tmp_path, 8)
    assert deep["arena_bytes"] == shallow["arena_bytes"]
    for phase in ("prefill", "decode"):
        assert deep["phases"][phase]["activation_bytes"] > 3 * shallow["phases"][phase]["activation_bytes"]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_compiled_plan_has_no_overlapping_live_buffers(tmp_path, phase):
    body = _compiled(tmp_path, 2)
    p = body["phases"][phase]
    life = {}
    for i, launch in enumerate(p["launches"]):
        for ref in launch["args"] + launch["outs"]:
            if "buf" in ref:
                lo, hi = life.get(ref["buf"], (i, i))
                life[ref["buf"]] = (min(lo, i), max(hi, i))
    for ref in p["outputs"].values():
        if "buf" in ref:
            life[ref["buf"]] = (life[ref["buf"]][0], len(p["launches"]))
    bufs = p["buffers"]
    for a, b in itertools.combinations(life, 2):
        (a0, a1), (b0, b1) = life[a], life[b]
        if a0 <= b1 and b0 <= a1:
            ra = (bufs[a]["offset"], bufs[a]["offset"] + bufs[a]["bytes"])
            rb = (bufs[b]["offset"], bufs[b]["offset"] + bufs[b]["bytes"])
            assert ra[1] <= rb[0] or rb[1] <= ra[0], (a, b)
    for b in life:
        assert 0 <= bufs[b]["offset"] and bufs[b]["offset"] + bufs[b]["bytes"] <= body["arena_bytes"], b

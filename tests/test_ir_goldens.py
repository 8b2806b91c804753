"""The printed IR of every phase of both fixtures and the real Gemma 3 270M, compared exactly with
golden files; every golden reads back to the same graph."""

import pytest

from llmplan.ir.parser import parse_graph
from llmplan.ir.printer import print_graph
from llmplan.ir.trace import PHASES, trace_model
from llmplan.ir.verify import verify
from llmplan.models.model import open_model

from conftest import TINY_BPE, TINY_SPM

MODELS = {"tiny-llama-spm": lambda _: TINY_SPM, "tiny-llama3-bpe": lambda _: TINY_BPE,
          "gemma3-270m": lambda request: request.getfixturevalue("gemma3_path")}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("model", list(MODELS))
def test_traced_ir_matches_golden(request, golden, model, phase):
    m = open_model(MODELS[model](request))
    g = verify(trace_model(m.definition, m.config, m.weight_table(), phase))
    text = print_graph(g)
    golden(f"ir/{model}.{phase}.ir", text)
    back = verify(parse_graph(text))
    assert print_graph(back) == text
    assert [(n.op, n.attrs, n.types) for n in back.order] == [(n.op, n.attrs, n.types) for n in g.order]

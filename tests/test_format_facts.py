"""One table per fact: the weight and activation formats' codes and block sizes are core/formats.py's,
generated for the kernels into codegen/kernels/formats.h, and an op's family is core/op_traits.py's.
A second definition of any of them in a kernel source (codegen/kernels/, codegen/cpu/) or in a package
folder but core/ (the kernel catalogs codegen/families/ and codegen/cpu_families/ among them) fails
here; an injected one shows that each rule catches its kind."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from llmplan.codegen import format_header
from llmplan.core.formats import ACTIVATIONS, FORMATS
from llmplan.core.op_traits import FAMILIES, MODULES, TRAITS, ops_of

ROOT = Path(__file__).parents[1]
CODEGEN = Path(format_header.__file__).parent
KERNEL_SOURCES = sorted([*(CODEGEN / "kernels").iterdir(), *(CODEGEN / "cpu").glob("*.h")])
PYTHON = sorted(p for d in ROOT.iterdir() if (d / "__init__.py").exists() and d.name != "core" for p in d.rglob("*.py"))

_NAMES = "|".join(sorted({*FORMATS, *(a.upper() for a in ACTIVATIONS)}, key=len, reverse=True))
_FORMAT_IDENT = re.compile(rf"(?:^|_)(?:{_NAMES})(?:_|$)")  # LP_Q4_K, LP_OUT_F16, LP_FMT_Q6_K_R16
_BLOCK_CONSTANT = re.compile(r"\b(?:BLOCK|BYTES|QK|SB|SUB|NFIELD|FB\d)\s*=\s*\d+")
_FORMAT_KEY = re.compile(rf"""["']({_NAMES})["']\s*:\s*\(?\s*\d+""", re.I)  # "q4_k": 8, "Q4_K": (8, ...
_OP_KEY = re.compile(r"""["'](\w+)["']\s*:\s*["'](\w+)["']""")
_OP_TUPLE = re.compile(r"""[(\[{]\s*((?:["']\w+["']\s*,\s*)+["']\w+["'])\s*,?\s*[)\]}]""")


def _code(text: str) -> str:
    """C++ without its comments (a comment may name a format next to a number)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def kernel_definitions(name: str, text: str) -> list[str]:
    """Format codes and block sizes a kernel source defines: a #define, enumerator or constexpr named
    for a format, or a format constant (BLOCK, BYTES, ...) set to a number."""
    code, found = _code(text), []
    defined = re.findall(r"#\s*define\s+(\w+)", code)
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", code):
        defined += re.findall(r"(\w+)\s*(?:=[^,]*)?(?:,|$)", body.strip())
    for statement in re.findall(r"\bconstexpr\b[^;{]*", code):
        defined += re.findall(r"(\w+)\s*=(?!=)", statement)
    found += [f"{name}: defines {d}" for d in defined if _FORMAT_IDENT.search(d)]
    found += [f"{name}: {m.group(0)}" for m in _BLOCK_CONSTANT.finditer(code)]
    return found


def python_definitions(name: str, text: str) -> list[str]:
    """Format codes or sizes keyed by format name, op -> family tables, and lists of a family's ops
    written out in a Python module."""
    families = {*FAMILIES, *(m for mods in MODULES.values() for m in (*mods.gpu, mods.cpu))}
    found = [f"{name}: {m.group(0)}" for m in _FORMAT_KEY.finditer(text)]
    found += [f"{name}: {m.group(0)}" for m in _OP_KEY.finditer(text)
              if m.group(1) in TRAITS and m.group(2) in families]
    for m in _OP_TUPLE.finditer(text):
        ops = set(re.findall(r"\w+", m.group(1)))
        found += [f"{name}: {m.group(0)} (the ops of family {f})" for f in FAMILIES if ops == set(ops_of(f))]
    return found


def test_formats_h_is_what_core_formats_generates():
    assert format_header.PATH.read_text() == format_header.render(), (
        "codegen/kernels/formats.h is not core/formats.py's: run python -m llmplan.codegen.format_header")


def test_no_kernel_source_defines_a_format_fact_again():
    assert format_header.PATH in KERNEL_SOURCES
    found = [d for p in KERNEL_SOURCES if p != format_header.PATH for d in kernel_definitions(p.name, p.read_text())]
    assert found == []


def test_no_python_module_defines_a_format_fact_or_op_family_again():
    assert CODEGEN / "families" / "gemm.py" in PYTHON and CODEGEN / "cpu_families" / "matmul.py" in PYTHON
    found = [d for p in PYTHON for d in python_definitions(str(p.relative_to(ROOT)), p.read_text())]
    assert found == []


@pytest.mark.parametrize("source, line, caught", [
    ("gemm.cu", "#define LP_Q4_K 8", ["defines LP_Q4_K"]),
    ("fused.cuh", "enum { LP_OUT_Q8_0, LP_OUT_Q8_1 };", ["defines LP_OUT_Q8_0", "defines LP_OUT_Q8_1"]),
    ("rows16.h", "enum { LP_FMT_Q4_K_R16 = 100 };", ["defines LP_FMT_Q4_K_R16"]),
    ("quant.cuh", "template <> struct LpWeight<LP_FMT_Q8_0> { static constexpr int PIECE = 16, BYTES = 34; };",
     ["BYTES = 34"]),
    ("matmul.h", "constexpr int LP_ACT_BF16 = 6;", ["defines LP_ACT_BF16"]),
])
def test_an_injected_kernel_definition_is_caught(source, line, caught):
    text = next(p for p in KERNEL_SOURCES if p.name == source).read_text()
    assert kernel_definitions(source, text) == []
    assert kernel_definitions(source, text + line + "\n") == [f"{source}: {c}" for c in caught]


@pytest.mark.parametrize("module, line, caught", [
    ("families/gemm.py", 'WEIGHT_CODES = {"f16": 0, "q4_0": 1}', ['"f16": 0', '"q4_0": 1']),
    ("cpu_families/embed.py", 'BLOCK_VALUES = {"F32": 1, "Q4_K": 256}', ['"F32": 1', '"Q4_K": 256']),
    ("cpu_families/__init__.py", 'FAMILY_MODULE = {"rmsnorm": "norm", "pack": "norm"}',
     ['"rmsnorm": "norm"', '"pack": "norm"']),
    ("families/matvec.py", 'OPS = ("matmul", "matmul_segmented", "matmul_residual")',
     ['("matmul", "matmul_segmented", "matmul_residual") (the ops of family matmul)']),
])
def test_an_injected_python_definition_is_caught(module, line, caught):
    text = (CODEGEN / module).read_text()
    assert python_definitions(module, text) == []
    assert python_definitions(module, text + line + "\n") == [f"{module}: {c}" for c in caught]


def test_every_family_names_modules_that_exist():
    assert set(MODULES) == set(FAMILIES)
    for family, mods in MODULES.items():
        assert ops_of(family)
        for m in mods.gpu:
            importlib.import_module(f"llmplan.codegen.families.{m}")
        importlib.import_module(f"llmplan.codegen.cpu_families.{mods.cpu}")

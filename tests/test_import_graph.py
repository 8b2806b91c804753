"""The folders are layers (docs/architecture.md): each imports only the folders its row of LAYERS names,
so the folder graph is acyclic. Every import counts: module-level and function-level ones, and
`importlib.import_module` with a literal name or an f-string whose literal prefix names a package (an
edge to every module under it). No module is special-cased, and a dynamic import the test cannot
resolve fails it. docs/architecture.md's diagram is rendered from LAYERS and checked here.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
# folder -> the folders it may import, lowest layer first
LAYERS = {
    "core": set(),
    "models": {"core"},
    "ir": {"core"},
    "passes": {"core", "ir"},
    "codegen": {"core"},
    "plans": {"core", "models", "ir", "passes", "codegen"},
    "runtime": {"core", "models", "codegen"},
    "tuning": {"core", "models", "codegen", "plans", "runtime"},
    "commands": {"core", "models", "ir", "passes", "codegen", "plans", "runtime", "tuning"},
}
# what each folder holds, for the diagram
ROLES = {
    "core": "what every stage shares: numerics, formats, layouts, op traits, errors, and the plan contract",
    "models": "model input: GGUF, configs, tokenizers, model definitions, quantizers",
    "ir": "the tensor IR, tracer, printer, interpreter",
    "passes": "fusion passes",
    "codegen": "kernel catalog: CUDA/HIP templates and families, the CPU target's C++ kernels, builds",
    "plans": "the compiler: lowering, buffers, kernel choice from the tune store, the compile pipeline",
    "runtime": "drivers, executor, K/V blocks, scheduler, engine, HTTP server",
    "tuning": "probes that time candidates through a driver and record verdicts in the tune store",
    "commands": "the `plan` verbs: the only layer that joins compiler, tuning and runtime",
}


def layer(module: str) -> str:
    """The folder of a module name such as llmplan.plans.lower."""
    return module.split(".")[1]


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for folder in LAYERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join(["llmplan", *parts])] = path
    return out


def _dynamic(call: ast.Call, where: str, known: set[str]) -> set[str]:
    """The modules an importlib.import_module call may load: a literal name, or every module under an
    f-string's literal package prefix."""
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value} & known
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
        if prefix.startswith("llmplan.") and prefix.endswith("."):
            return {m for m in known if m.startswith(prefix)}
    raise AssertionError(f"{where}: importlib.import_module({ast.unparse(arg) if arg else ''}) names no module "
                         f"the import test can resolve: use a literal or f'llmplan.<package>.{{name}}'")


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every llmplan module `name` imports, at any depth of its code (function bodies included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module"):
            found |= _dynamic(node, f"{path}:{node.lineno}", known)
    return {m for m in found if m in known and m != name}


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def folder_graph(g: dict[str, set[str]]) -> nx.DiGraph:
    """Folder -> folder, each edge labelled with one module import that makes it."""
    out = nx.DiGraph()
    out.add_nodes_from(LAYERS)
    for src, targets in sorted(g.items()):
        for dst in sorted(targets):
            a, b = layer(src), layer(dst)
            if a != b and not out.has_edge(a, b):
                out.add_edge(a, b, via=f"{src} imports {dst}")
    return out


def violations(root: Path) -> list[str]:
    """Imports a folder's layer does not allow, and every folder cycle with the imports that close it."""
    g = graph(root)
    out = [f"{src} imports {dst}: {layer(src)} may not import {layer(dst)}"
           for src, targets in sorted(g.items()) for dst in sorted(targets)
           if layer(src) != layer(dst) and layer(dst) not in LAYERS[layer(src)]]
    folders = folder_graph(g)
    order = list(LAYERS)
    for cycle in nx.simple_cycles(folders):
        first = min(range(len(cycle)), key=lambda i: order.index(cycle[i]))
        cycle = cycle[first:] + cycle[:first]  # from its lowest layer, so the message is stable
        edges = zip(cycle, cycle[1:] + cycle[:1])
        out.append("folder cycle " + " -> ".join(cycle + cycle[:1]) + ": "
                   + "; ".join(folders.edges[e]["via"] for e in edges))
    return out


def diagram() -> str:
    """docs/architecture.md's layer diagram: each folder, what it holds, and what it may import."""
    width, order = max(map(len, LAYERS)), list(LAYERS)
    lines = []
    for f in reversed(order):
        below = ", ".join(sorted(LAYERS[f], key=order.index)) or "nothing"
        lines += [f"{f + '/':<{width + 1}}  {ROLES[f]}", f"{'':<{width + 1}}    imports {below}"]
    return "```\n" + "\n".join(lines) + "\n```\n"


def _copy(tmp_path: Path) -> Path:
    for folder in LAYERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_layer_table_is_acyclic():
    assert nx.is_directed_acyclic_graph(nx.DiGraph([(a, b) for a, bs in LAYERS.items() for b in bs]))


def test_the_package_holds_its_layers():
    assert violations(ROOT) == []


def test_an_injected_cycle_is_found(tmp_path):
    """The runtime importing the compiler makes plans -> codegen ... and runtime -> plans: an upward edge,
    and with commands importing both, a cycle once plans imports the runtime back."""
    root = _copy(tmp_path)
    assert violations(root) == []
    victim = root / "plans" / "lower.py"
    victim.write_text(victim.read_text() + "\n\ndef _late():\n    from llmplan.runtime.engine import Engine\n")
    victim = root / "runtime" / "kv_blocks.py"
    victim.write_text(victim.read_text() + "\nfrom llmplan.plans.buffers import place  # noqa\n")
    found = violations(root)
    assert "llmplan.plans.lower imports llmplan.runtime.engine: plans may not import runtime" in found
    assert "llmplan.runtime.kv_blocks imports llmplan.plans.buffers: runtime may not import plans" in found
    assert ("folder cycle plans -> runtime -> plans: llmplan.plans.lower imports llmplan.runtime.engine; "
            "llmplan.runtime.kv_blocks imports llmplan.plans.buffers") in found


def test_dynamic_imports_count(tmp_path):
    """importlib strings are edges: a literal name, and an f-string's package prefix (every module under it)."""
    root = _copy(tmp_path)
    victim = root / "codegen" / "kernel.py"
    victim.write_text(victim.read_text() + "\nimport importlib  # noqa\n\n\ndef _late(name):\n"
                      "    return importlib.import_module(f'llmplan.tuning.{name}')\n")
    found = violations(root)
    assert "llmplan.codegen.kernel imports llmplan.tuning.probes: codegen may not import tuning" in found
    victim.write_text(victim.read_text() + "\n\ndef _later(name):\n    return importlib.import_module(name)\n")
    try:
        violations(root)
    except AssertionError as e:
        assert "names no module the import test can resolve" in str(e)
    else:
        raise AssertionError("an unresolvable dynamic import was accepted")


def test_the_architecture_page_shows_the_layer_table():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert diagram() in page, f"docs/architecture.md's layer diagram is out of date; it should read:\n{diagram()}"

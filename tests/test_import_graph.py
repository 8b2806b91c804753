"""The package's import graph holds DESIGN.md's one-way flow, function-level imports included.

Layers, lowest first: core (what every stage shares: numerics, formats, errors) < models (GGUF,
configs, tokenizers, model definitions) < ir < passes < codegen (the kernel catalog the planner picks
from, rendering, compiling) < plans (choosing, laying out, the plan file) < runtime < the command layer
(plans/cli.py and plans/cmd_*.py, which drive every stage). A module may import its own folder and
any lower layer; codegen imports no IR (it takes plans' lowered launches as data); and nothing the
runtime imports reaches ir/ or passes/, through any chain.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core", "models", "ir", "passes", "codegen", "plans", "runtime")
LAYERS = ("core", "models", "ir", "passes", "codegen", "plans", "runtime", "commands")
# what each layer may import besides itself: every lower layer, except as narrowed here
ALLOWED = {layer: set(LAYERS[:i]) for i, layer in enumerate(LAYERS)}
ALLOWED["ir"] = {"core"}  # the IR knows nothing of GGUF files
ALLOWED["codegen"] = {"core"}  # kernels know formats and page sizes, not the IR or the planner
ALLOWED["runtime"] = {"core", "models", "codegen", "plans"}  # the plan file and the GGUF, never the IR
UNREACHABLE_FROM_RUNTIME = ("ir", "passes")


def layer(module: str) -> str:
    """The layer of a module name such as llmplan.plans.cmd_run."""
    parts = module.split(".")
    if parts[1] == "plans" and len(parts) > 2 and (parts[2] == "cli" or parts[2].startswith("cmd_")):
        return "commands"
    return parts[1]


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join(["llmplan", *parts])] = path
    return out


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
    return {m for m in found if m in known}


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def violations(root: Path) -> list[str]:
    g = graph(root)
    out = []
    for src, targets in g.items():
        for dst in sorted(targets):
            a, b = layer(src), layer(dst)
            if a != b and b not in ALLOWED[a]:
                out.append(f"{src} imports {dst}: {a} may not import {b}")
    for start in (m for m in g if layer(m) == "runtime"):
        seen, todo, via = {start}, [start], {start: None}
        while todo:
            m = todo.pop()
            for n in g[m]:
                if n not in seen:
                    seen.add(n)
                    via[n] = m
                    todo.append(n)
        for m in sorted(seen):
            if layer(m) in UNREACHABLE_FROM_RUNTIME:
                chain = [m]
                while via[chain[-1]] is not None:
                    chain.append(via[chain[-1]])
                out.append(f"{start} reaches {m}: {' <- '.join(chain)}")
                break
    return out


def test_the_package_holds_the_one_way_flow():
    assert violations(ROOT) == []


def test_function_level_imports_count(tmp_path):
    """A forbidden import added inside a function body of a copy of the package is found."""
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(tmp_path) == []
    victim = tmp_path / "runtime" / "kv_blocks.py"
    victim.write_text(victim.read_text() + "\n\ndef _late():\n    from llmplan.passes.manager import run_passes\n")
    found = violations(tmp_path)
    assert "llmplan.runtime.kv_blocks imports llmplan.passes.manager: runtime may not import passes" in found
    # and through the chain: the scheduler reaches the IR by way of kv_blocks
    assert any(v.startswith("llmplan.runtime.scheduler reaches llmplan.") and
               v.endswith("llmplan.passes.manager <- llmplan.runtime.kv_blocks <- llmplan.runtime.scheduler")
               for v in found), found


def test_a_cycle_between_folders_is_refused(tmp_path):
    """codegen importing the planner (the old codegen/select.py) is an upward edge."""
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    victim = tmp_path / "codegen" / "kernel.py"
    victim.write_text(victim.read_text() + "\nfrom llmplan.plans.devices import DeviceFacts  # noqa\n")
    assert "llmplan.codegen.kernel imports llmplan.plans.devices: codegen may not import plans" in violations(tmp_path)

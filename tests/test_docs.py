"""The README links the project's own architecture document, and that document names what the code
has: every source folder, every pass in order, every driver; the tokenizer document names every
pre-tokenizer with its type."""

import re
import tomllib
from pathlib import Path

from llmplan.models.pre_tokenizers import NAMES
from llmplan.passes.manager import PASS_NAMES
from llmplan.runtime.driver import DRIVERS

ROOT = Path(__file__).parents[1]


def test_readme_links_the_architecture_document():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert "docs/architecture.md" in links
    assert all((ROOT / link).exists() for link in links if not link.startswith("http"))


def test_the_architecture_document_names_what_the_code_has():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    folders = {d.split("/")[0] for d in tomllib.loads((ROOT / "pyproject.toml").read_text())
               ["tool"]["setuptools"]["package-dir"].values()}
    assert all(f"`{f}/`" in doc for f in folders), folders
    assert ", ".join(f"`{p}`" for p in PASS_NAMES) in doc.replace("\n   ", " ")
    assert all(f"`{d}`" in doc for d in DRIVERS)


def test_the_tokenizer_document_names_every_pre_tokenizer():
    doc = (ROOT / "docs" / "tokenizers.md").read_text()
    listed: dict[str, list[str]] = {}
    for types, names in re.findall(r"^\| ([a-z0-9_, ]+) \| (`.*`) \|$", doc, re.M):
        for name in re.findall(r"`([^`]+)`", names):
            assert name not in listed, name
            listed[name] = types.split(", ")
    assert set(listed) == set(NAMES)
    assert all(NAMES[name].type in types for name, types in listed.items())

"""Reads the printer's text back into a Graph (the inverse of ir/printer.py)."""

from __future__ import annotations

import re
from typing import Any

from .errors import ParseError
from .graph import Graph, Node, Value, make_node
from .ops import REGISTRY, with_defaults
from .types import Type, parse_type

_HEADER = re.compile(r"graph (?P<name>[\w.\-]+)\((?P<sig>.*)\) \{$")
_WEIGHT = re.compile(r"(?P<name>@\S+) : (?P<type>\S+\[.*\])$")
_NODE = re.compile(r"(?P<results>%\d+(?:, %\d+)*) = (?P<op>\w+)(?:\[(?P<attrs>[^\]]*)\])?(?: (?P<operands>[^:]+?))?"
                   r" : (?P<types>.+)$")
_RETURN = re.compile(r"return (?P<outs>.*)$")


def _split(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _attr_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def parse_graph(text: str) -> Graph:
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if not lines or not (m := _HEADER.match(lines[0])):
        raise ParseError("line 1: expected 'graph NAME(%input: type, ...) {'")
    nodes: list[Node] = []
    names: dict[str, Value] = {}

    def add(op: str, operands: list[Value], attrs: dict[str, Any], types: list[Type]) -> Node:
        node = make_node(len(nodes), op, operands, attrs, types)
        nodes.append(node)
        return node

    for item in _split(m["sig"]):
        name, _, t = item.partition(":")
        names[name.strip()] = add("input", [], {"name": name.strip()[1:]}, [parse_type(t)]).out
    outputs = None
    for lineno, line in enumerate(lines[1:], start=2):
        try:
            if line == "}":
                break
            if (w := _WEIGHT.match(line)):
                names[w["name"]] = add("weight", [], {"name": w["name"][1:]}, [parse_type(w["type"])]).out
            elif (n := _NODE.match(line)):
                if n["op"] not in REGISTRY:
                    raise ParseError(f"unknown op {n['op']!r}")
                attrs = {}
                for a in _split(n["attrs"] or ""):
                    k, _, v = a.partition("=")
                    attrs[k.strip()] = _attr_value(v.strip())
                operands = [names[o] for o in _split(n["operands"] or "")]
                node = add(n["op"], operands, with_defaults(n["op"], attrs), [parse_type(t) for t in _split(n["types"])])
                for i, r in enumerate(_split(n["results"])):
                    names[r] = Value(node.id, i)
            elif (r := _RETURN.match(line)):
                outputs = [(k.strip(), names[v.strip()]) for k, _, v in (o.partition("=") for o in _split(r["outs"]))]
            else:
                raise ParseError("not a weight, node or return line")
        except KeyError as e:
            raise ParseError(f"line {lineno}: {e.args[0]} is not defined before its use") from None
        except ParseError as e:
            raise ParseError(f"line {lineno}: {e}: {line}") from None
        except ValueError as e:
            raise ParseError(f"line {lineno}: {e}: {line}") from None
    if outputs is None:
        raise ParseError("no return line")
    return Graph(m["name"], nodes, outputs)

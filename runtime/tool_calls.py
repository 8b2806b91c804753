"""Tool calls on chat completions: the tools a request offers put into the prompt, the model's call
syntax parsed back into OpenAI's `tool_calls` (whole or streamed), and the grammar that makes a
required call valid against its function's schema.

A model's chat template that takes `tools` and whose call syntax we know renders them itself:
  "hermes"  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>   (Qwen 2.5 / 3, Hermes)
  "llama3"  {"name": ..., "parameters": {...}}   the whole answer            (Llama 3.1 / 3.2)
Any other model gets a generic system prompt that lists the tools and asks for the hermes syntax, and
its conversation's tool calls and results are written back in that syntax (a tool result as a user
turn: templates such as Gemma's allow only alternating user and assistant turns).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from . import grammar
from .grammar import Grammar

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # the JSON schema of its arguments

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str


def syntax_of(template: str | None) -> str | None:
    """The call syntax a chat template renders tools for, or None when it takes no tools we can parse."""
    if not template or "tools" not in template:
        return None
    if HERMES_OPEN in template:
        return "hermes"
    if PYTHON_TAG in template or '"parameters"' in template:
        return "llama3"
    return None


def _calls_text(calls: list[dict[str, Any]]) -> str:
    """An assistant turn's tool calls in the hermes syntax (the generic prompt's)."""
    bodies = (json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}) for c in calls)
    return "\n".join(f"{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}" for body in bodies)


def generic_prompt(tools: list[Tool], choice: str | None) -> str:
    """The system prompt that offers tools to a model whose template does not take them."""
    lines = ["You can call these tools. Each is given as JSON: its name, what it does, and the JSON schema "
             "of its arguments.", ""]
    lines += [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                         ensure_ascii=False) for t in tools]
    lines += ["", f"To call a tool, answer with only:\n{HERMES_OPEN}\n"
                  f'{{"name": "<tool name>", "arguments": {{<its arguments>}}}}\n{HERMES_CLOSE}']
    if choice == "required":
        lines.append("You must call one of the tools.")
    elif choice is not None:
        lines.append(f"You must call {choice}.")
    else:
        lines.append("If no tool helps, answer normally.")
    return "\n".join(lines)


def prompt(messages: list[dict[str, Any]], tools: list[Tool], choice: str | None, syntax: str | None
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for a conversation that offers `tools` (choice: None for
    auto, "required", or a function's name). An assistant message's tool_calls are OpenAI's, with the
    arguments as an object (as chat templates read them)."""
    if syntax is not None:
        return messages, {"tools": [t.as_openai() for t in tools]}
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            text = "\n".join(filter(None, [m.get("content") or "", _calls_text(m["tool_calls"])]))
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            result = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    system = generic_prompt(tools, choice)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out, {}


def call_grammar(tools: list[Tool], choice: str, syntax: str | None) -> Grammar:
    """One call of a tool (`choice`: "required", any of them; else that function), its arguments valid
    against the function's schema."""
    offered = tools if choice == "required" else [t for t in tools if t.name == choice]
    key = "parameters" if syntax == "llama3" else "arguments"
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, key: t.parameters},
                         "required": ["name", key], "additionalProperties": False} for t in offered],
              "x-guidance": grammar.JSON_OPTIONS}
    call = f"call: %json {json.dumps(schema)}"
    if syntax == "llama3":
        return grammar.lark(f"start: call\n{call}", "tools")
    return grammar.lark(f'start: {json.dumps(HERMES_OPEN + chr(10))} call {json.dumps(chr(10) + HERMES_CLOSE)}\n{call}',
                        "tools")


def _call(text: str, tools: dict[str, Tool], key: str) -> Call | None:
    """A call from its JSON text, if it names an offered tool and has object arguments."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False), f"call_{uuid.uuid4().hex[:24]}")


class CallParser:
    """The model's answer as content and calls, fed as it streams: push() returns (content that is
    safe to show, calls completed); text that may still become a call is held back."""

    def __init__(self, tools: list[Tool], syntax: str | None):
        self.tools = {t.name: t for t in tools}
        self.syntax = syntax or "hermes"
        self.calls: list[Call] = []
        self._held = ""  # text not yet shown: a possible opening tag, or a call in progress
        self._started = False  # llama3: the answer began as a JSON object (a call until proven otherwise)

    def push(self, text: str) -> tuple[str, list[Call]]:
        self._held += text
        if self.syntax == "llama3":
            return self._push_llama3()
        shown, found = "", []
        while True:
            at = self._held.find(HERMES_OPEN)
            if at < 0:
                keep = _partial_suffix(self._held, HERMES_OPEN)
                shown += self._held[:len(self._held) - keep]
                self._held = self._held[len(self._held) - keep:]
                return shown, found
            end = self._held.find(HERMES_CLOSE, at)
            if end < 0:
                shown += self._held[:at]
                self._held = self._held[at:]
                return shown, found
            body = self._held[at + len(HERMES_OPEN):end]
            call = _call(body.strip(), self.tools, "arguments")
            if call is None:
                shown += self._held[:end + len(HERMES_CLOSE)]
            else:
                shown += self._held[:at]
                found.append(call)
                self.calls.append(call)
            self._held = self._held[end + len(HERMES_CLOSE):]

    def _push_llama3(self) -> tuple[str, list[Call]]:
        stripped = self._held.lstrip()
        if not self._started:
            if not stripped or PYTHON_TAG.startswith(stripped):
                return "", []
            self._started = stripped.startswith(("{", PYTHON_TAG))
            if not self._started:
                shown, self._held = self._held, ""
                return shown, []
        return "", []

    def flush(self) -> tuple[str, list[Call]]:
        """At the end: what is still held, as a call or as content."""
        held, self._held = self._held, ""
        if self.syntax == "llama3" and self._started:
            call = _call(held.strip().removeprefix(PYTHON_TAG).strip(), self.tools, "parameters")
            if call is not None:
                self.calls.append(call)
                return "", [call]
        return held, []


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0

"""`plan chat-template MODEL.gguf --messages FILE.json`: the prompt the model's chat template makes.

FILE.json holds a list of {"role": ..., "content": ...} objects (or {"messages": [...]}). The prompt is
printed exactly, without a newline added; a model without a template gets the plain fallback
(`role: content` lines, then `assistant:`).
"""

from __future__ import annotations

import argparse
import json
import sys

from llmplan.core.console import print_json
from llmplan.models.errors import ChatTemplateError
from llmplan.models.tokenizer import load_tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat-template", help="render a conversation with the model's chat template",
                       description=__doc__)
    p.add_argument("model", help="GGUF file (a vocabulary-only file will do)")
    p.add_argument("--messages", required=True, metavar="FILE.json", help="the conversation, as JSON")
    p.add_argument("--no-generation-prompt", action="store_true",
                   help="do not end with the assistant's turn header")
    p.add_argument("--json", action="store_true", help='print {"prompt": ...}')
    p.set_defaults(run=run)


def _read_messages(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except UnicodeDecodeError as e:
            raise ChatTemplateError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    return data["messages"] if isinstance(data, dict) and "messages" in data else data


def run(args: argparse.Namespace) -> int:
    messages = _read_messages(args.messages)
    prompt = load_tokenizer(args.model).render_chat(messages, add_generation_prompt=not args.no_generation_prompt)
    if args.json:
        print_json({"prompt": prompt})
    else:
        sys.stdout.write(prompt)
    return 0

"""`plan detokenize MODEL.gguf ID...`: the text of token ids (control tokens shown only with --special)."""

from __future__ import annotations

import argparse
import sys

from llmplan.core.console import print_json
from llmplan.models.tokenizer import load_tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("detokenize", help="token ids -> text with the model's tokenizer", description=__doc__)
    p.add_argument("model", help="GGUF file (a vocabulary-only file will do)")
    p.add_argument("ids", nargs="+", type=int, metavar="ID", help="token ids")
    p.add_argument("--special", action="store_true", help="show control tokens (<s>, <|eot_id|>, ...)")
    p.add_argument("--json", action="store_true", help='print {"text": ...}')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    text = load_tokenizer(args.model).decode(args.ids, special=args.special)
    if args.json:
        print_json({"text": text})
    else:
        sys.stdout.write(text + "\n")
    return 0

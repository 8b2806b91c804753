"""`plan tokenize MODEL.gguf TEXT`: the token ids llama.cpp would give TEXT, with their pieces.

BOS (and EOS) follow the model's add_bos_token/add_eos_token unless --no-bos; special tokens written in
TEXT (<|eot_id|>, <end_of_turn>, ...) become single ids only with --special.
"""

from __future__ import annotations

import argparse

from llmplan.core.console import format_table, print_json
from llmplan.models.tokenizer import load_tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenize", help="text -> token ids with the model's tokenizer", description=__doc__)
    p.add_argument("model", help="GGUF file (a vocabulary-only file will do)")
    p.add_argument("text", help="text to tokenize")
    p.add_argument("--no-bos", action="store_true", help="add no BOS/EOS even if the model asks for them")
    p.add_argument("--special", action="store_true", help="parse special tokens written in the text")
    p.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    tok = load_tokenizer(args.model)
    ids = tok.encode(args.text, add_special=not args.no_bos, parse_special=args.special)
    pieces = [tok.piece(i).decode("utf-8", errors="replace") for i in ids]
    if args.json:
        print_json({"ids": ids, "pieces": pieces})
    elif ids:
        print(format_table(["id", "piece"], [(i, repr(p)) for i, p in zip(ids, pieces)]))
    return 0

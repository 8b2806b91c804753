"""`plan make-model`: write a GGUF with random weights for a preset shape and a quantization recipe."""

from __future__ import annotations

import argparse
import os

from llmplan.core.console import format_table, human_bytes, print_json
from llmplan.core.errors import InputError
from llmplan.models.builder import plan_build
from llmplan.models.presets import PRESETS
from llmplan.models.recipes import RECIPES


def register(sub: argparse._SubParsersAction) -> None:
    presets = "; ".join(f"{n}: {p.description}" for n, p in PRESETS.items())
    p = sub.add_parser("make-model", help="write a synthetic GGUF model (random weights)",
                       description=f"{__doc__} Presets: {presets}.")
    p.add_argument("--preset", required=True, choices=list(PRESETS), help="model shape (see the presets above)")
    p.add_argument("--recipe", default="Q4_K_M", choices=list(RECIPES), help="quantization recipe (default Q4_K_M)")
    p.add_argument("-o", "--output", help="output file (default: <preset>-<recipe>.gguf)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field of the preset, e.g. --set n_layers=4 (repeatable)")
    p.add_argument("--vocab-from", metavar="GGUF", help="copy the tokenizer from this GGUF instead of a synthetic one")
    p.add_argument("--weights", default="auto", choices=["auto", "float", "blocks"],
                   help="float: quantize random normal weights; blocks: draw random quantized blocks "
                        "(fast, for big models); auto picks by size")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InputError(f"--set expects FIELD=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    out = args.output or f"{args.preset}-{args.recipe}.gguf"
    if os.path.isdir(out):
        raise InputError(f"{out} is a directory; give a file name with -o")
    if os.path.exists(out) and not (args.force or args.dry_run):
        raise InputError(f"{out} exists; pass --force to overwrite it")
    build = plan_build(out, args.preset, args.recipe, args.seed, args.vocab_from, args.weights,
                       _overrides(args.set))
    seconds = None if args.dry_run else build.write(progress=not args.json)
    formats: dict[str, dict[str, int]] = {}
    for _, _, ttype, _, nbytes in build.writer.tensors:
        row = formats.setdefault(ttype.name, {"count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += nbytes
    report = {
        "path": out, "written": not args.dry_run, "preset": args.preset, "recipe": args.recipe, "seed": args.seed,
        "weights": build.weights, "file_bytes": build.file_size, "seconds": seconds,
        "config": build.config.to_dict(), "formats": dict(sorted(formats.items(), key=lambda kv: -kv[1]["bytes"])),
        "tensors": [{"name": n, "format": f.name, "shape": list(build.shapes[n])} for n, f in build.formats.items()],
    }
    if args.json:
        print_json(report)
        return 0
    verb = "would write" if args.dry_run else "wrote"
    took = "" if seconds is None else f" in {seconds:.1f} s"
    print(f"{verb} {out}: {args.preset} {args.recipe}, {len(build.formats)} tensors, "
          f"{build.file_size} bytes ({human_bytes(build.file_size)}){took}; random weights: its text is gibberish")
    rows = [(f, v["count"], v["bytes"]) for f, v in report["formats"].items()]
    print("  " + format_table(["format", "tensors", "bytes"], rows).replace("\n", "\n  "))
    return 0


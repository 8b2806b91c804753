"""`plan passes MODEL.gguf`: what every fusion pass did to one phase's graph: node counts before and
after, declines with their reasons, unified diffs of the printed IR (--diff), or one .ir file per pass
(--dump DIR) for plain `diff`."""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from llmplan.core.console import format_table, print_json
from llmplan.ir.printer import print_graph
from llmplan.ir.trace import PHASES, trace_model
from llmplan.models.model import open_model
from llmplan.passes.manager import check_pass_name, run_passes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("passes", help="show what each fusion pass changed", description=__doc__)
    p.add_argument("model", help="GGUF file")
    p.add_argument("--phase", default="decode", choices=PHASES, help="which phase graph (default decode)")
    p.add_argument("--diff", action="store_true", help="unified diffs of the printed IR between passes")
    p.add_argument("--only", metavar="PASS", help="report this pass only")
    p.add_argument("--dump", metavar="DIR", help="write NN_<pass>.ir for the traced graph and after every pass")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    only = check_pass_name(args.only) if args.only else None
    model = open_model(args.model)
    snaps = run_passes(trace_model(model.definition, model.config, model.weight_table(), args.phase))
    texts = [print_graph(s.graph) for s in snaps]
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for i, (s, t) in enumerate(zip(snaps, texts)):
            with open(os.path.join(args.dump, f"{i:02d}_{s.name}.ir"), "w") as f:
                f.write(t)
    steps = [(i, s) for i, s in enumerate(snaps) if i > 0 and (only is None or s.name == only)]
    if args.json:
        print_json({
            "graph": snaps[0].graph.name, "phase": args.phase,
            "passes": [{"name": s.name, "nodes_before": snaps[i - 1].node_count, "nodes_after": s.node_count,
                        "declines": list(s.declines)} for i, s in steps],
            "final_op_counts": snaps[-1].graph.op_counts(),
        })
        return 0
    if args.diff:
        for i, s in steps:
            diff = difflib.unified_diff(texts[i - 1].splitlines(True), texts[i].splitlines(True),
                                        f"{i - 1:02d}_{snaps[i - 1].name}.ir", f"{i:02d}_{s.name}.ir")
            sys.stdout.writelines(diff)
        return 0
    rows = [(s.name, snaps[i - 1].node_count, s.node_count, len(s.declines)) for i, s in steps]
    print(f"{snaps[0].graph.name}: {snaps[0].node_count} traced nodes -> {snaps[-1].node_count} after all passes")
    print(format_table(["pass", "nodes before", "nodes after", "declines"], rows))
    for _, s in steps:
        for d in s.declines:
            print(d)
    if args.dump:
        print(f"wrote {len(snaps)} files to {args.dump}")
    return 0

"""`plan info MODEL.gguf`: architecture, config, tokenizer, tensors by format, bytes read per token."""

from __future__ import annotations

import argparse

from llmplan.core.console import format_table, human_bytes, print_json
from llmplan.models.info import describe


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a GGUF model file", description=__doc__)
    p.add_argument("model", help="GGUF file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    d = describe(args.model)
    if args.json:
        print_json(d)
        return 0
    c = d["config"]
    print(f"{d['path']}: {d['architecture']} \"{d['name']}\", GGUF v{d['gguf_version']}, {human_bytes(d['file_bytes'])}")
    print(f"  layers {c['n_layers']}, dim {c['dim']}, heads {c['n_heads']} x {c['head_dim']}, "
          f"kv heads {c['n_kv_heads']}, ffn {c['ffn_dim']}, vocab {c['vocab_size']}, context {c['context_length']}")
    rope = f"rope base {c['rope_base']:g} over {c['rope_dims']} dims"
    if c["rope_scale"] != 1.0:
        rope += f", linear scale {c['rope_scale']:g}"
    if c["rope_freqs"]:
        rope += ", per-frequency factors (rope_freqs)"
    print(f"  {rope}; rms-norm eps {c['norm_eps']:.3g}; {c['activation']} GLU; "
          f"attention scale {c['attn_scale']:.6g}")
    extras = []
    if c["swa_window"]:
        glob = [i for i in range(c["n_layers"]) if i not in set(c["swa_layers"])]
        extras.append(f"sliding window {c['swa_window']} (rope base {c['rope_base_swa']:g}), global layers {glob}")
    if c["qk_norm"]:
        extras.append("query/key norms")
    if c["sandwich_norms"]:
        extras.append("post-attention and post-FFN norms")
    if c["embed_scale"] != 1.0:
        extras.append(f"embedding scale {c['embed_scale']:.6g}")
    if c["n_experts"]:
        extras.append(f"{c['n_experts']} experts of FFN width {c['expert_ffn_dim']}, {c['n_experts_used']} routed per token")
    extras.append("output tied to token_embd" if c["tied_output"] else "separate output head")
    print("  " + "; ".join(extras))
    t = d["tokenizer"]
    if t:
        pre = f", pre-tokenizer {t['pre']}" if t["pre"] else ""
        merges = f", {t['merges']} merges" if t["merges"] else ""
        print(f"tokenizer: {t['kind']}, {t['tokens']} tokens{merges}{pre}"
              f"{', chat template' if t['chat_template'] else ', no chat template'}")
    else:
        print("tokenizer: none")
    if not d["tensor_count"]:
        print("tensors: none (vocabulary-only file)")
        return 0
    rows = [(fmt, v["count"], v["bytes"], human_bytes(v["bytes"])) for fmt, v in d["formats"].items()]
    rows.append(("total", d["tensor_count"], d["tensor_bytes"], human_bytes(d["tensor_bytes"])))
    print("tensors:")
    print("  " + format_table(["format", "tensors", "bytes", ""], rows).replace("\n", "\n  "))
    head = "; the tied output head reads the whole table" if c["tied_output"] else ""
    n = d["decode_bytes_per_token"]
    if c["n_experts"]:
        every = d["decode_bytes_per_token_every_expert"]
        print(f"decode reads {n} bytes ({human_bytes(n)}) per token, the active weights: every weight except the "
              f"embedding table and the experts, the {c['n_experts_used']} routed of {c['n_experts']} experts' rows, "
              f"plus one embedding row{head} (every expert's rows: {every} bytes, {human_bytes(every)})")
    else:
        print(f"decode reads {n} bytes ({human_bytes(n)}) per token: every weight except the embedding table, plus one "
              f"embedding row{head}")
    return 0

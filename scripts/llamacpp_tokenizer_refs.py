"""Records llama.cpp's tokenizations for every BPE pre-tokenizer name, its end-of-generation tokens and
its chat templates' renderings into tests/data, with the small real vocabularies they are made on.

    python scripts/llamacpp_tokenizer_refs.py path/to/llama.cpp/models

Needs llama-cpp-python 0.3.36 (the reference; the tests do not) and llama.cpp's test vocabularies
(ggml-vocab-*.gguf in the models/ folder of its source). Every name in models/pre_tokenizers.NAMES is
recorded on a real vocabulary: its own where llama.cpp ships one, else with tokenizer.ggml.pre rewritten to
the name on Qwen 2's, GPT-2's and DeepSeek LLM's (byte-level names: between them they merge across the
places where pre-tokenizers cut differently, CJK after a space, digit runs, case changes) or on Gemma 4's
(the names that keep UTF-8 text). A real
vocabulary is megabytes, so each is cut down to what the corpus needs: the special tokens, the
single characters, and every token and merge that BPE uses on the pieces llama.cpp or we make of the
corpus under any of the names recorded on it (merges keep their order, so BPE gives the same result on
those pieces). The script checks that llama.cpp's ids on the cut vocabulary are its ids on the whole
one, token for token, before it records them.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
from gguf import GGUFValueType as V
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.gguf_write import GGUFWriter
from llmplan.models.pre_tokenizers import NAMES, TYPES
from llmplan.models.pretokenize import pre_tokenizer
from llmplan.models.special_tokens import SpecialTokenSplitter
from llmplan.models.tokenizer_bpe import byte_to_char
from llmplan.models.vocab import read_vocab

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
OUT = DATA / "llamacpp_pretokenizers.json"

# Hard strings: whitespace runs, digits of every length, scripts, emoji, code, contractions, accents,
# special-token texts of several families, control and invisible characters.
CORPUS = [
    "Hello world", " Hello  world ", "", " ", "  ", "   leading", "trailing   ", "a  b   c    d", "\t\ttabs\t x",
    "\n\n\nnewlines\n\n", "mixed \t\n \r\n  end\r\n", "\r\n\r\n", "\u00a0nbsp\u3000ideographic\u2028line\u0085next",
    "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234", "3.14159 + 42 = 1234567",
    "1,234,567.89 and 0x1F", "x 12345 y", "12ab34 a1b22c333d4444", "٣٤٥٦٧ ①②③ Ⅻ x²³",
    "日本語のテキスト", "中文分词测试，你好！世界。", "한국어 텍스트입니다", "カタカナとひらがな",
    "混合English和中文123",
    "emoji 😀🚀 and 👍🏽 👨‍👩‍👧 🇫🇷", "∑ x² ≤ 10⁶ → ∞",
    "def f(x):\n    return x ** 2  # square", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "<div class=\"x\">&nbsp;</div>", "SELECT * FROM t WHERE id='42';", "path/to/file.py:12 // x=>x*2",
    "don't won't I'll they're we've", "DON'T I'M YOU'RE WE'VE THEY'LL HE'D", "Don'T It'S rock 'n' roll 's 't",
    "l'homme d'état", "naïve café — déjà vu", "Ångström Øresund Straße",
    "e\u0301 combining \u0915\u093f\u0928\u094d\u0926\u0940", "Ελληνικά κείμενο", "Привет, мир!", "हिन्दी पाठ",
    "ไทย ภาษาไทย", "עברית", "العربية ١٢٣", "Hello世界مرحبا Мир", "CamelCaseWords HTTPServer XMLHttpRequest iPhone",
    "ALLCAPS lowercase Titlecase ÉCOLE école",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x<|endoftext|>",
    "<s>[INST] hi [/INST]</s>", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<start_of_turn>user\nhi<end_of_turn>", "<|user|>\nhi<|end|>\n<|assistant|>",
    "\x00\x1c\x1f control \x0b\x0c", "\u200b\ufeff zero width \ue000", "IMGIMGABZ <sentinel:12>", "    four  two \t\t",
    " " * 600 + "x" + " " * 20 + "\n",
    # where the pre-tokenizers differ and real vocabularies have merges across the difference
    "你好 世界 中文 和 English，日本 語", " 123 4567 89 2024", "Call 911 or +1 (555) 123-4567, 1/3 of 100000",
    "getHTTPResponseCode parseXMLDocument myVariableName ABCdef", "I'M HERE, YOU'LL SEE. we'd've y'all",
    "a\n\nb\n\n\nc \n\n  \n",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello, how can I help?"}, {"role": "user", "content": "Tell me a joke.\n"}],
    [{"role": "user", "content": "  spaced  "}, {"role": "assistant", "content": "ok"}],
]

# vocabulary file -> the names recorded on it (the cut file is tests/data/vocab-<stem>.gguf)
OWN = {"gpt-2": ["gpt-2"], "qwen2": ["qwen2"], "qwen35": ["qwen35"], "deepseek-llm": ["deepseek-llm"],
       "deepseek-coder": ["deepseek-coder"], "falcon": ["falcon"], "mpt": ["mpt"], "starcoder": ["starcoder"],
       "refact": ["refact"], "command-r": ["command-r"], "gemma-4": ["gemma4"]}
BYTE_LEVEL_BASES, UTF8_BASE = ("qwen2", "gpt-2", "deepseek-llm"), "gemma-4"
CHAT_TEMPLATES = ("qwen2", "command-r", "gemma-4")  # and Phi-3's (phi3())
DROPPED_FOR_RENAMED = ["tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"]  # the name's defaults show


def renamed(name: str, base: str) -> dict:
    """How a base vocabulary is rewritten to carry another pre-tokenizer name."""
    changes = {"set": {"tokenizer.ggml.pre": name}, "drop": DROPPED_FOR_RENAMED}
    if base == UTF8_BASE:  # tokenizer.ggml.model gemma4 would force the name 'gemma4'
        changes["set"]["tokenizer.ggml.model"] = "gpt2"
    return changes


def plan() -> dict[str, list[tuple[str, dict]]]:
    """Vocabulary stem -> [(name, changes)]."""
    out = {stem: [(n, {"set": {}, "drop": []}) for n in names] for stem, names in OWN.items()}
    own = {n for names in OWN.values() for n in names}
    for name, pre in NAMES.items():
        if name not in own:
            for base in BYTE_LEVEL_BASES if TYPES[pre.type].byte_encode else (UTF8_BASE,):
                out[base].append((name, renamed(name, base)))
    return out


def write_gguf(path: Path, metadata: dict[str, MetaValue]) -> None:
    w = GGUFWriter(path)
    for key, value in metadata.items():
        w.add(key, value)
    w.write([])


def with_changes(src: GGUFFile, changes: dict) -> dict[str, MetaValue]:
    meta = {k: v for k, v in src.metadata.items() if k not in changes["drop"]}
    meta.update({k: MetaValue(V.STRING, v) for k, v in changes["set"].items()})
    return meta


def skipped(name: str, text: str) -> bool:
    """Texts llama.cpp aborts on: with UTF-8 pieces and spaces kept, a piece of whitespace holding a
    space and another character fails its assertion that no merge symbol has a space."""
    return name == "whitespace" and re.search(r" \s|\s ", text) is not None


class Llama:
    """llama.cpp's tokenizer on a vocabulary file."""

    def __init__(self, path: Path):
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    def eog(self, n: int) -> list[int]:
        return [i for i in range(n) if llama_cpp.llama_vocab_is_eog(self.vocab, i)]

    def close(self) -> None:
        self.llm.close()
        gc.collect()


def special_texts(src: GGUFFile) -> list[str]:
    """Two texts made of the vocabulary's own first special tokens."""
    tokens = src.metadata["tokenizer.ggml.tokens"].value
    types = np.asarray(src.metadata["tokenizer.ggml.token_type"].value)
    names = [tokens[i] for i in np.flatnonzero((types == 3) | (types == 4)) if len(tokens[i]) > 1][:3]
    if not names:
        return []
    a, b, c = (names * 3)[:3]
    return [f"{a}{b}text {c}", f" {a} spaced {b}\n{c}{c}x"]


def runs(path: Path, texts: list[str], name: str) -> dict:
    """llama.cpp's ids for `texts`: without special tokens added, special tokens as text and parsed,
    and the ids adding them puts before and after (checked to be the same for every text)."""
    llm = Llama(path)
    plain, parsed, ends = [], [], None
    for text in texts:
        if skipped(name, text):
            plain.append(None)
            parsed.append(None)
            continue
        pair = [llm.tokenize(text, False, p) for p in (False, True)]
        for ids, p in zip(pair, (False, True)):
            full = llm.tokenize(text, True, p)
            splits = [(full[:a], full[a + len(ids):]) for a in range(len(full) - len(ids) + 1)
                      if full[a:a + len(ids)] == ids]
            if ends not in splits and not (ends is None and len(splits) == 1):
                raise SystemExit(f"{name}: adding special tokens changed more than the ends of {text!r}")
            ends = ends or splits[0]
        plain.append(pair[0])
        parsed.append(pair[1] if pair[1] != pair[0] else None)
    llm.close()
    return {"add_special": {"before": ends[0], "after": ends[1]}, "plain": plain, "parsed": parsed}


def bpe(word: str, ranks: dict[tuple[str, str], int]) -> tuple[list[int], list[str]]:
    """llama.cpp's merge loop on one piece: the ranks it applies and the symbols it ends with."""
    syms, applied = list(word), []
    while len(syms) > 1:
        found = [(ranks[p], i) for i, p in enumerate(zip(syms, syms[1:])) if p in ranks]
        if not found:
            break
        rank, i = min(found)
        applied.append(rank)
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    return applied, syms


def our_pieces(path: Path, texts: list[str]) -> set[str]:
    """The merge symbols' texts of every piece our pre-tokenizer makes of `texts`, both modes."""
    vocab = read_vocab(GGUFFile(path))
    pre = TYPES[NAMES[vocab.pre].type]
    split, splitter = pre_tokenizer(pre.expressions), SpecialTokenSplitter(vocab)
    byte_map = {b: c for b, c in enumerate(byte_to_char())}
    out = set()
    for text in texts:
        for parse in (False, True):
            for piece in splitter.split(text, parse):
                if isinstance(piece, str):
                    piece = piece.replace(" ", "\u2581") if vocab.escape_whitespaces else piece
                    for word in split(piece):
                        out.add(word.encode().decode("latin-1").translate(byte_map) if pre.byte_encode else word)
    return out


def cut(src: GGUFFile, words: set[str], used_ids: set[int], out: Path) -> dict[int, int]:
    """Write the cut vocabulary; returns old id -> new id."""
    meta = src.metadata
    tokens = list(meta["tokenizer.ggml.tokens"].value)
    types = np.asarray(meta["tokenizer.ggml.token_type"].value)
    merges = list(meta["tokenizer.ggml.merges"].value) if "tokenizer.ggml.merges" in meta else []
    ranks = {}
    for r, m in enumerate(merges):
        k = m.find(" ", 1)
        ranks.setdefault((m[:k], m[k + 1:]), r)
    token_id = {t: i for i, t in enumerate(tokens)}
    keep_ranks: set[int] = set()
    symbols: set[str] = set()
    for word in words | {tokens[i] for i in used_ids}:
        applied, syms = bpe(word, ranks)
        keep_ranks.update(applied)
        symbols.update(syms)
        symbols.update(word)
    keep = set(used_ids) | set(np.flatnonzero(types != 1).tolist())
    keep |= {token_id[s] for s in symbols if s in token_id}
    keep |= {int(v.value) for k, v in meta.items() if k.endswith("_token_id")}
    if meta["tokenizer.ggml.model"].value == "gpt2":
        keep |= {token_id[c] for c in byte_to_char() if c in token_id}
    order = sorted(keep)
    new_id = {old: new for new, old in enumerate(order)}
    kept_merges = [merges[r] for r in sorted(keep_ranks)]
    new_meta = {}
    for k, v in meta.items():
        if k == "tokenizer.ggml.tokens":
            v = MetaValue(V.ARRAY, [tokens[i] for i in order], V.STRING)
        elif k in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            v = MetaValue(V.ARRAY, np.asarray(v.value)[order], v.element_type)
        elif k == "tokenizer.ggml.merges":
            v = MetaValue(V.ARRAY, kept_merges, V.STRING)
        elif k.endswith("_token_id"):
            v = MetaValue(v.type, new_id[int(v.value)])
        new_meta[k] = v
    write_gguf(out, new_meta)
    return new_id


def chat_records(src: GGUFFile) -> list[dict]:
    """The vocabulary's chat template on each conversation, rendered by llama-cpp-python's Jinja
    formatter (Hugging Face's Jinja settings): the model's own rendering."""
    template = src.get("tokenizer.chat_template")
    tokens = src.metadata["tokenizer.ggml.tokens"].value
    bos, eos = (tokens[src.get(f"tokenizer.ggml.{k}_token_id")] for k in ("bos", "eos"))
    return [{"messages": messages, "add_generation_prompt": gen,
             "prompt": Jinja2ChatFormatter(template, eos, bos, add_generation_prompt=gen)(messages=messages).prompt}
            for messages in CONVERSATIONS for gen in (True, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", type=Path, help="llama.cpp's models/ folder (ggml-vocab-*.gguf)")
    models = ap.parse_args().models
    record: dict = {"llama_cpp_python": llama_cpp.__version__, "texts": CORPUS, "vocabs": {}, "names": {},
                    "runs": []}
    run_index: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        for stem, variants in plan().items():
            src = GGUFFile(models / f"ggml-vocab-{stem}.gguf")
            texts = CORPUS + special_texts(src)
            words: set[str] = set()
            used: set[int] = set()
            whole: dict[str, dict] = {}
            for name, changes in variants:
                path = tmpdir / f"{name}.gguf"
                write_gguf(path, with_changes(src, changes))
                whole[name] = runs(path, texts, name)
                for r in whole[name]["plain"] + whole[name]["parsed"]:
                    used.update(r or [])
                used.update(whole[name]["add_special"]["before"] + whole[name]["add_special"]["after"])
                words |= our_pieces(path, texts)
            target = DATA / f"vocab-{stem}.gguf"
            new_id = cut(src, words, used, target)
            small = GGUFFile(target)
            for name, changes in variants:
                path = tmpdir / f"{name}.cut.gguf"
                write_gguf(path, with_changes(small, changes))
                got = runs(path, texts, name)
                remap = lambda ids: None if ids is None else [new_id[i] for i in ids]  # noqa: E731
                want = {"add_special": {k: remap(v) for k, v in whole[name]["add_special"].items()},
                        "plain": [remap(r) for r in whole[name]["plain"]],
                        "parsed": [remap(r) for r in whole[name]["parsed"]]}
                if got != want:
                    raise SystemExit(f"{name}: llama.cpp tokenizes differently on the cut vocabulary {target.name}")
                key = json.dumps(got)
                if key not in run_index:
                    run_index[key] = len(record["runs"])
                    record["runs"].append(got)
                record["names"].setdefault(name, []).append({"vocab": target.name, **changes, "run": run_index[key]})
            llm = Llama(target)
            record["vocabs"][target.name] = {
                "from": f"ggml-vocab-{stem}.gguf", "texts": texts[len(CORPUS):],
                "eog": llm.eog(len(small.metadata["tokenizer.ggml.tokens"].value)),
                **({"chat": chat_records(small)} if stem in CHAT_TEMPLATES else {}),
            }
            llm.close()
            print(f"{target.name}: {len(variants)} names, {target.stat().st_size} bytes", file=sys.stderr)
        record["vocabs"].update(phi3(models))
    OUT.write_text(json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)


def phi3(models: Path) -> dict:
    """Phi-3's SentencePiece vocabulary cut to its special and byte tokens: its end-of-generation tokens
    and chat template, no pre-tokenizer."""
    src = GGUFFile(models / "ggml-vocab-phi-3.gguf")
    target = DATA / "vocab-phi-3.gguf"
    cut(src, set(), set(), target)
    small = GGUFFile(target)
    llm = Llama(target)
    entry = {"from": "ggml-vocab-phi-3.gguf", "texts": [],
             "eog": llm.eog(len(small.metadata["tokenizer.ggml.tokens"].value)), "chat": chat_records(small)}
    llm.close()
    return {target.name: entry}


if __name__ == "__main__":
    main()

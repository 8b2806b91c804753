"""llama.cpp's BPE pre-tokenizers as data (src/llama-vocab.cpp of the llama.cpp that llama-cpp-python 0.3.36
vendors).

A BPE vocabulary names its pre-tokenizer in `tokenizer.ggml.pre` (Gemma 4's tokenizer model implies
`gemma4`). llama.cpp maps the name to a type (NAMES), and the name may set a few flags of its own:
ignore_merges (a pre-token that is a whole token skips the merges), add_bos (the default of
tokenizer.ggml.add_bos_token), escape_whitespaces (spaces become U+2581 before splitting, and again spaces
when decoding), and whether the type keeps the default BOS id. The type fixes the regular expressions
text is split with before the merges (TYPES): applied in turn, each splitting every piece the one before
left, the text between two matches kept as a piece of its own. The expressions are llama.cpp's strings,
character for character, because llama.cpp recognises a few of them by their text and runs its own
matchers for those (models/pretokenize.py does the same).

llama.cpp also sets clean_spaces per name, which only changes its detokenizer's output; we do not apply
it (models/detokenize.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# The expressions llama.cpp runs hand-written matchers for (unicode.cpp, unicode_regex_split_custom).
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
KIMI_K2 = r"\p{Han}+"  # stands for Kimi K2's whole expression, which std::regex cannot run
AFMOE_DIGITS = r"\p{AFMoE_digits}"  # digit runs in groups of three from the right
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"  # run as AFMOE_DIGITS
NEWLINES = r"[^\n]+|[\n]+"

# Expressions used by several types.
_DIGIT = r"\p{N}"
_DIGITS_1_3 = r"\p{N}{1,3}"
_DIGIT_RUNS = r"\p{N}+"
_CJK_DEEPSEEK = "[一-龥ࠀ-一가-\ud7ff]+"
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_GPT4O_LETTERS = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS
                  + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?")
_DEEPSEEK3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
              "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")


@dataclass(frozen=True)
class PreType:
    """One LLAMA_VOCAB_PRE_TYPE_*: its expressions and how its pieces become merge symbols."""

    expressions: tuple[str, ...]
    byte_encode: bool = True  # pieces in GPT-2's byte characters; else raw UTF-8, a missing byte as <0xXX>
    newline_words: bool = False  # a piece of newlines only that is a token is that token (gemma4)
    force_bos: bool = False  # add BOS even where the file says not to (llama.cpp's Gemma 4 workaround)


_LLAMA3 = PreType((LLAMA3,))
_QWEN2 = PreType((QWEN2,))
_GPT2 = PreType((GPT2,))
_STARCODER = PreType((_DIGIT, GPT2))
_DEEPSEEK3_LLM = PreType((_DIGITS_1_3, _CJK_KANA, _DEEPSEEK3))
_GEMMA4 = PreType((NEWLINES,), byte_encode=False, newline_words=True, force_bos=True)

# llama.cpp's type names (LLAMA_VOCAB_PRE_TYPE_*, lower case) -> what the type does
TYPES: dict[str, PreType] = {
    "default": PreType((r"[\p{P}\$\+<=>\^~\|]+", GPT2, _DIGIT_RUNS, r"[0-9][0-9][0-9]")),
    "llama3": _LLAMA3, "dbrx": _LLAMA3, "smaug": _LLAMA3, "chatglm4": _LLAMA3,
    "jais2": PreType((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                      r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
                      r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",)),
    "deepseek_llm": PreType((
        "[\r\n]",
        # six of its letters are written as escapes: Unicode normalization would turn them into others
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-Ⴥ"
        "Ꭰ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄ"
        "ῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿ"
        "ⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲"
        "𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+",
        r"\s+$",
        _CJK_DEEPSEEK,
        _DIGIT_RUNS,
    )),
    "deepseek3_llm": _DEEPSEEK3_LLM, "hunyuan_dense": _DEEPSEEK3_LLM, "joyai_llm": _DEEPSEEK3_LLM,
    "hy_v4": _DEEPSEEK3_LLM,
    "spark2_5": PreType((_DIGITS_1_3, _CJK_KANA,
                         "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                         "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                         "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
                         _DIGIT)),
    "youtu": PreType((
        "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS
        + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    "deepseek_coder": PreType(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_DEEPSEEK, _DIGIT)),
    "falcon": PreType((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("starcoder", "refact", "command_r", "smollm", "codeshell", "exaone", "minerva", "mellum2"),
                    _STARCODER),
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais", "trillion", "granite_docling"), _GPT2),
    **dict.fromkeys(("stablelm2", "qwen2", "hunyuan", "solar_open", "grok_2"), _QWEN2),
    "qwen35": PreType((QWEN35,)),
    **dict.fromkeys(("poro", "bloom", "gpt3_finnish"), PreType((_BLOOM,))),
    "viking": PreType((_BLOOM, _DIGIT)),
    "tekken": PreType((r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                       r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
                       r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",)),
    "chameleon": PreType((r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                          _DIGIT, r"[\p{P}!-/:-@\[-`{-~]", GPT2)),
    **dict.fromkeys(("gpt4o", "minimax_m2"),
                    PreType((_GPT4O_LETTERS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",))),
    "granite_emb_multi": PreType((
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS
        + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",)),
    "tiny_aya": PreType((
        TINY_AYA_DIGITS,
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS
        + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    "kimi_k2": PreType((KIMI_K2,)),
    "superbpe": PreType((_DIGIT_RUNS, r"(?=(\d{3})+(?!\d))")),
    "bailingmoe": PreType((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",)),
    "seed_coder": PreType((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                           r"|\s+(?!\S)|\s+",)),
    "ufakzeka": PreType((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)),
    "afmoe": PreType((
        AFMOE_DIGITS,
        "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdf"
        "เ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff가-\ud7afᄀ-ᇿ]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    "laguna": PreType((NEWLINES, QWEN2)),
    "exaone_moe": PreType((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",)),
    "gemma4": _GEMMA4,
    "sarvam_moe": PreType((NEWLINES,), byte_encode=False),
    "minicpm5": PreType((_DIGITS_1_3, _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                                                      r"|\s*[\r\n]+|\s+(?!\S)|\s+")),
    "whitespace": PreType((r"\S+",), byte_encode=False),
}


@dataclass(frozen=True)
class PreTokenizer:
    """What a `tokenizer.ggml.pre` name selects."""

    type: str  # a key of TYPES
    ignore_merges: bool = False
    add_bos: bool = False
    escape_whitespaces: bool = False
    keeps_bos_id: bool = True  # False: no BOS id unless tokenizer.ggml.bos_token_id names one (ChatGLM)


def _names(type_: str, *names: str, **flags: bool) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names, PreTokenizer(type_, **flags))


# tokenizer.ggml.pre -> pre-tokenizer, in llama.cpp's order (llama_vocab::impl::load)
NAMES: dict[str, PreTokenizer] = {
    **_names("default", "default"),
    **_names("minicpm5", "minicpm5", ignore_merges=True),
    **_names("llama3", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
             "jina-v5-nano", ignore_merges=True, add_bos=True),
    **_names("deepseek_llm", "deepseek-llm"),
    **_names("deepseek_coder", "deepseek-coder"),
    **_names("deepseek3_llm", "deepseek-v3"),
    **_names("spark2_5", "spark2_5"),
    **_names("youtu", "youtu", ignore_merges=True),
    **_names("falcon", "falcon"),
    **_names("mpt", "mpt"),
    **_names("starcoder", "starcoder"),
    **_names("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
             "mellum", "modern-bert"),
    **_names("jais2", "jais-2"),
    **_names("gemma4", "gemma4", "granite-embed-multi-311m", escape_whitespaces=True),
    **_names("sarvam_moe", "sarvam-moe", escape_whitespaces=True),
    **_names("gpt2", "jina-v1-en", "jina-v2-code", "roberta-bpe"),
    **_names("whitespace", "whitespace"),
    **_names("refact", "refact"),
    **_names("command_r", "command-r"),
    **_names("qwen2", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"),
    **_names("qwen35", "qwen35"),
    **_names("stablelm2", "stablelm2"),
    **_names("olmo", "olmo"),
    **_names("dbrx", "dbrx"),
    **_names("smaug", "smaug-bpe"),
    **_names("poro", "poro-chat"),
    **_names("chatglm4", "chatglm-bpe", keeps_bos_id=False),
    **_names("chatglm4", "glm4", "glm5", keeps_bos_id=False, ignore_merges=True),
    **_names("viking", "viking"),
    **_names("jais", "jais"),
    **_names("tekken", "tekken", ignore_merges=True, add_bos=True),
    **_names("smollm", "smollm"),
    **_names("codeshell", "codeshell"),
    **_names("bloom", "bloom"),
    **_names("gpt3_finnish", "gpt3-finnish"),
    **_names("exaone", "exaone"),
    **_names("gpt2", "exaone4"),
    **_names("exaone_moe", "exaone-moe"),
    **_names("chameleon", "chameleon", add_bos=True),
    **_names("minerva", "minerva-7b"),
    **_names("qwen2", "megrez"),
    **_names("gpt4o", "gpt-4o", "llama4", "kanana2", "talkie"),
    **_names("granite_emb_multi", "granite-embed-multi-97m", ignore_merges=True),
    **_names("tiny_aya", "tiny_aya", "cohere2moe"),
    **_names("superbpe", "superbpe"),
    **_names("trillion", "trillion"),
    **_names("granite_docling", "granite-docling"),
    **_names("bailingmoe", "bailingmoe", "bailingmoe2", "llada-moe"),
    **_names("seed_coder", "seed-coder"),
    **_names("hunyuan", "hunyuan"),
    **_names("hunyuan_dense", "hunyuan-dense"),
    **_names("hy_v4", "hy_v4"),
    **_names("joyai_llm", "joyai-llm"),
    **_names("kimi_k2", "kimi-k2"),
    **_names("ufakzeka", "ufakzeka"),
    **_names("grok_2", "grok-2"),
    **_names("afmoe", "afmoe"),
    **_names("laguna", "laguna"),
    **_names("minimax_m2", "minimax-m2"),
    **_names("solar_open", "solar-open"),
    **_names("mellum2", "mellum2"),
}

"""The configs of qwen2, qwen3, phi3 and the llama variants real files use (tied output, no rope_freqs,
head size not dim / heads, q/k/v biases, fused attn_qkv): written then read back the same, llama.cpp's
defaults and rules for their keys, errors that name the key, and built files that llama.cpp loads."""

import dataclasses
import math

import numpy as np
import pytest
from gguf import GGUFValueType as V

from llmplan.commands import llama_cpp
from llmplan.core.errors import InputError
from llmplan.models.builder import plan_build
from llmplan.models.config import TENSOR_FLAGS, config_from_gguf, config_to_metadata
from llmplan.models.errors import ConfigError
from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.gguf_write import GGUFWriter
from llmplan.models.model import open_model
from llmplan.models.presets import preset_config
from llmplan.models.tensor_table import expected_tensors
from model_files import rewrite, u32

NEW_PRESETS = ["tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-mistral", "llama3.2-1b", "smollm2-135m",
               "mistral-nemo", "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "phi3-mini", "tiny-qwen3moe",
               "tiny-mixtral", "qwen3-30b-a3b", "mixtral-8x7b"]


def _metadata_only(path, c):
    """A file with the config's metadata and a vocabulary of the right size but no tensors."""
    w = GGUFWriter(path)
    for k, v in config_to_metadata(c):
        w.add(k, v)
    w.add("tokenizer.ggml.tokens", MetaValue(V.ARRAY, [f"t{i}" for i in range(c.vocab_size)], V.STRING))
    w.write([])
    return GGUFFile(path)


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_metadata_round_trip(tmp_path, preset):
    """Every hyperparameter survives config_to_metadata and config_from_gguf; what the tensor table says
    (tied output, biases, fused q|k|v, rope factors) is read from tensors, which this file has none of."""
    c = preset_config(preset)
    read = config_from_gguf(_metadata_only(tmp_path / "m.gguf", c))
    assert read == dataclasses.replace(c, tied_output=False, **{flag: False for flag in TENSOR_FLAGS})


VARIANTS = [
    ("tiny-qwen2", {}),
    ("tiny-qwen2", {"fused_qkv": "true"}),
    ("tiny-qwen3", {}),
    ("tiny-qwen3", {"qkv_bias": "true", "tied_output": "true"}),
    ("tiny-phi3", {}),
    ("tiny-phi3", {"fused_qkv": "false", "qkv_bias": "true", "longrope": "false"}),
    ("tiny-mistral", {}),
    ("tiny-mistral", {"fused_qkv": "true", "qkv_bias": "true"}),
    ("tiny-qwen3moe", {}),
    ("tiny-mixtral", {}),
]


VARIANT_IDS = [f"{p}-{'-'.join(o) or 'preset'}" for p, o in VARIANTS]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """Each variant written at Q4_K_M by the builder: id -> (Build, path)."""
    root = tmp_path_factory.mktemp("variants")
    out = {}
    for vid, (preset, overrides) in zip(VARIANT_IDS, VARIANTS):
        b = plan_build(root / f"{vid}.gguf", preset, "Q4_K_M", overrides=overrides)
        b.write(progress=False)
        out[vid] = b, root / f"{vid}.gguf"
    return out


@pytest.mark.parametrize("vid", VARIANT_IDS)
def test_built_file_reads_back(variants, vid):
    """The builder writes the layout the config implies; the reader binds every tensor of it and gets the
    same config back."""
    b, path = variants[vid]
    m = open_model(path)
    assert m.config == b.config and list(m.weights) == list(expected_tensors(b.config))


@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
@pytest.mark.parametrize("vid", VARIANT_IDS)
def test_llama_cpp_runs_built_file(variants, vid):
    """llama.cpp's loader rejects a missing or an unused tensor: it loads and runs every layout we write."""
    b, path = variants[vid]
    llm = llama_cpp.load(str(path), 64, threads=1)
    llm.eval([1, 2, 3])
    row = llama_cpp.last_logits(llm)
    assert row.shape == (b.config.vocab_size,) and np.isfinite(row).all() and row.std() > 0


def test_layouts_name_what_llama_cpp_loads():
    """Tensor names and shapes of one layer, as each architecture's load_arch_tensors creates them."""
    def layer(preset, **overrides):
        shapes = expected_tensors(preset_config(preset, overrides))
        return {n.removeprefix("blk.0."): s for n, s in shapes.items() if n.startswith("blk.0.")}

    assert layer("tiny-qwen2") == {
        "attn_k.bias": (128,), "attn_k.weight": (384, 128), "attn_norm.weight": (384,),
        "attn_output.weight": (384, 384), "attn_q.bias": (384,), "attn_q.weight": (384, 384),
        "attn_v.bias": (128,), "attn_v.weight": (384, 128), "ffn_down.weight": (768, 384),
        "ffn_gate.weight": (384, 768), "ffn_norm.weight": (384,), "ffn_up.weight": (384, 768)}
    assert layer("tiny-qwen3") == {
        "attn_k.weight": (256, 256), "attn_k_norm.weight": (128,), "attn_norm.weight": (256,),
        "attn_output.weight": (512, 256), "attn_q.weight": (256, 512), "attn_q_norm.weight": (128,),
        "attn_v.weight": (256, 256), "ffn_down.weight": (768, 256), "ffn_gate.weight": (256, 768),
        "ffn_norm.weight": (256,), "ffn_up.weight": (256, 768)}
    assert layer("tiny-phi3", qkv_bias="true") == {
        "attn_norm.weight": (256,), "attn_output.weight": (256, 256), "attn_qkv.bias": (768,),
        "attn_qkv.weight": (256, 768), "ffn_down.weight": (768, 256), "ffn_norm.weight": (256,),
        "ffn_up.weight": (256, 1536)}
    assert layer("tiny-mistral") == {
        "attn_k.weight": (512, 128), "attn_norm.weight": (512,), "attn_output.weight": (256, 512),
        "attn_q.weight": (512, 256), "attn_v.weight": (512, 128), "ffn_down.weight": (512, 512),
        "ffn_gate.weight": (512, 512), "ffn_norm.weight": (512,), "ffn_up.weight": (512, 512)}
    top = [n for n in expected_tensors(preset_config("tiny-phi3")) if not n.startswith("blk.")]
    assert top == ["output.weight", "output_norm.weight", "rope_factors_long.weight", "rope_factors_short.weight",
                   "token_embd.weight"]
    assert expected_tensors(preset_config("tiny-phi3"))["rope_factors_long.weight"] == (48,)  # rope dims / 2


def test_architecture_traits():
    presets = ("tiny-llama", "tiny-gemma3", "tiny-qwen2", "tiny-qwen3", "tiny-phi3")
    modes = {p: preset_config(p).rope_mode for p in presets}
    assert modes == {"tiny-llama": "norm", "tiny-gemma3": "neox", "tiny-qwen2": "neox", "tiny-qwen3": "neox",
                     "tiny-phi3": "neox"}
    q3, phi = preset_config("tiny-qwen3"), preset_config("tiny-phi3")
    assert q3.qk_norm and (q3.head_dim, q3.q_dim, q3.dim) == (128, 512, 256)
    assert phi.fused_gate_up and phi.fused_qkv and phi.longrope and (phi.rope_dims, phi.head_dim) == (96, 128)
    nemo = preset_config("mistral-nemo")
    assert (nemo.q_dim, nemo.dim, nemo.rope_mode, nemo.rope_freqs, nemo.tied_output) == \
        (4096, 5120, "norm", False, False)


def test_longrope_factors_by_context():
    """llama.cpp's get_rope_factors: the long factors once the context per sequence, rounded up to a
    multiple of 256 as llama.cpp rounds it, exceeds the original context, the short ones up to it;
    rope_freqs where the file has them; nothing otherwise."""
    phi = preset_config("tiny-phi3")
    assert (phi.rope_original_context, phi.context_length) == (32, 4096)
    assert phi.rope_factors(32) == "rope_factors_long.weight"  # llama.cpp runs 256 positions at the least
    mini = preset_config("phi3-mini")
    assert mini.rope_original_context == 4096
    assert mini.rope_factors(4000) == mini.rope_factors(4096) == "rope_factors_short.weight"
    assert mini.rope_factors(4097) == "rope_factors_long.weight"
    assert preset_config("tiny-llama3").rope_factors(33) == "rope_freqs.weight"
    assert preset_config("tiny-qwen2").rope_factors(10 ** 6) is None
    # the converter's attention factor for 4096 / 32: sqrt(1 + ln 128 / ln 32), held as a float32
    assert phi.rope_attn_factor == pytest.approx(math.sqrt(1 + math.log(128) / math.log(32)), rel=1e-7)
    assert preset_config("phi3-mini").rope_attn_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)),
                                                                      rel=1e-7)
    assert preset_config("tiny-qwen3").rope_attn_factor == 1.0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Tiny files of each new architecture, F32 (fast to write)."""
    root = tmp_path_factory.mktemp("archs")
    paths = {}
    for preset in ("tiny-qwen2", "tiny-qwen3", "tiny-phi3", "tiny-mistral", "tiny-qwen3moe"):
        paths[preset] = root / f"{preset}.gguf"
        plan_build(paths[preset], preset, "F32").write(progress=False)
    return paths


def test_llama_cpp_defaults(tmp_path, built):
    """Absent keys take llama.cpp's defaults: the original context is the training context (also when the
    key is 0), the attention factor 1; scaling type none never scales positions."""
    path = rewrite(built["tiny-phi3"], tmp_path / "p.gguf",
                   drop_meta=("phi3.rope.scaling.attn_factor", "phi3.rope.scaling.original_context_length"))
    c = config_from_gguf(GGUFFile(path))
    assert (c.rope_original_context, c.rope_attn_factor, c.rope_factors(4096)) == \
        (4096, 1.0, "rope_factors_short.weight")
    path = rewrite(built["tiny-phi3"], tmp_path / "z.gguf",
                   set_meta={"phi3.rope.scaling.original_context_length": u32(0)})
    assert config_from_gguf(GGUFFile(path)).rope_original_context == 4096
    for kind, scale in (("none", 1.0), ("linear", 0.25)):
        path = rewrite(built["tiny-qwen2"], tmp_path / f"{kind}.gguf", set_meta={
            "qwen2.rope.scaling.type": MetaValue(V.STRING, kind),
            "qwen2.rope.scaling.factor": MetaValue(V.FLOAT32, 4.0)})
        assert config_from_gguf(GGUFFile(path)).rope_scale == scale


BAD = [
    ("tiny-qwen2", {"qwen2.attention.key_length": u32(128), "qwen2.attention.value_length": u32(128)},
     "qwen2.attention.key_length 128 times head_count 6 must equal embedding_length 384"),
    ("tiny-qwen3", {"qwen3.rope.dimension_count": u32(64)},
     "qwen3.rope.dimension_count 64 must equal the head size 128"),
    ("tiny-qwen3", {"qwen3.attention.value_length": u32(64)}, "value_length 64 differs from key_length 128"),
    ("tiny-phi3", {"phi3.rope.dimension_count": u32(160)},
     "phi3.rope.dimension_count 160 must be even and within the head size 128"),
    ("tiny-phi3", {"phi3.rope.scaling.attn_factor": MetaValue(V.FLOAT32, 0.0)}, "phi3.rope.scaling.attn_factor is 0.0"),
    ("tiny-phi3", {"phi3.rope.scaling.attn_factor": MetaValue(V.FLOAT32, float("inf"))},
     "phi3.rope.scaling.attn_factor is inf"),
    ("tiny-phi3", {"phi3.rope.scaling.original_context_length": MetaValue(V.STRING, "32")},
     "phi3.rope.scaling.original_context_length must be an integer, is STRING"),
    ("tiny-phi3", {"phi3.rope.scaling.type": MetaValue(V.STRING, "longrope")},
     "phi3.rope.scaling.type 'longrope' is not supported"),
    ("tiny-mistral", {"llama.rope.dimension_count": u32(64)},
     "llama.rope.dimension_count 64 must equal the head size 128"),
    ("tiny-qwen3moe", {"qwen3moe.expert_used_count": u32(17)},
     r"qwen3moe.expert_used_count is 17 \(must be 1..16 experts\)"),
    ("tiny-qwen3moe", {"qwen3moe.expert_count": u32(0)}, "qwen3moe.expert_count must be > 0 for qwen3moe"),
    ("tiny-qwen3moe", {"qwen3moe.expert_count": u32(2048)}, r"qwen3moe.expert_count is 2048 \(must be 1..1024\)"),
    ("tiny-mistral", {"llama.expert_count": u32(8), "llama.expert_used_count": u32(2)},
     r"missing tensor blk.0.ffn_down_exps.weight \(shape \(512, 512, 8\)\) and 7 more"),
]


@pytest.mark.parametrize("preset,edit,message", BAD, ids=[f"{p}-{m.split(' ')[0]}" for p, _, m in BAD])
def test_bad_keys_named(tmp_path, built, preset, edit, message):
    path = rewrite(built[preset], tmp_path / "bad.gguf", set_meta=edit)
    with pytest.raises(ConfigError, match=message):
        open_model(path)


def test_missing_key_length_is_a_shape_error(tmp_path, built):
    """Without key_length qwen3's head size falls back to dim / heads (64), which the q/k norms disagree with."""
    path = rewrite(built["tiny-qwen3"], tmp_path / "bad.gguf",
                   drop_meta=("qwen3.attention.key_length", "qwen3.attention.value_length"))
    with pytest.raises(ConfigError, match=r"attn_k.weight has shape \(256, 256\), the config implies \(256, 128\)"):
        open_model(path)


def test_tensors_an_architecture_does_not_take(tmp_path, built):
    """A file whose tensors disagree with its architecture names the tensor."""
    cases = [
        ("tiny-qwen2", {"drop_tensors": ("blk.1.attn_v.bias",)},
         r"missing tensor blk.1.attn_v.bias \(shape \(128,\)\)"),
        ("tiny-qwen3", {"drop_tensors": ("blk.0.attn_q_norm.weight",)}, "missing tensor blk.0.attn_q_norm.weight"),
        ("tiny-phi3", {"drop_tensors": ("rope_factors_short.weight",)}, "missing tensor rope_factors_short.weight"),
        ("tiny-phi3", {"add_tensors": {"blk.0.attn_q.bias": ("output_norm.weight", (256,))}},
         "unexpected tensor blk.0.attn_q.bias for architecture phi3"),
        ("tiny-phi3", {"add_tensors": {"rope_freqs.weight": ("rope_factors_long.weight", (48,))}},
         "unexpected tensor rope_freqs.weight for architecture phi3"),
        ("tiny-qwen3", {"add_tensors": {"rope_factors_long.weight": ("blk.0.attn_q_norm.weight", (128,))}},
         "unexpected tensor rope_factors_long.weight for architecture qwen3"),
        ("tiny-phi3", {"reshape": {"blk.1.ffn_up.weight": (512, 768)}},
         r"blk.1.ffn_up.weight has shape \(512, 768\), the config implies \(256, 1536\)"),
    ]
    for preset, edit, message in cases:
        path = rewrite(built[preset], tmp_path / "bad.gguf", **edit)
        with pytest.raises(ConfigError, match=message):
            open_model(path)


def test_preset_flags_the_architecture_does_not_read():
    with pytest.raises(ConfigError, match="gemma3 models have no q/k/v biases"):
        preset_config("tiny-gemma3", {"qkv_bias": "true"})
    with pytest.raises(ConfigError, match="llama models have no rope_factors_long/short.weight"):
        preset_config("tiny-mistral", {"longrope": "true"})
    with pytest.raises(ConfigError, match="qwen2 models have no rope_freqs.weight"):
        preset_config("tiny-qwen2", {"rope_freqs": "true"})
    with pytest.raises(InputError, match="cannot set 'fused_gate_up'"):
        preset_config("tiny-phi3", {"fused_gate_up": "false"})
    with pytest.raises(InputError, match="cannot set 'rope_mode'"):
        preset_config("tiny-qwen2", {"rope_mode": "norm"})


def test_real_presets_have_the_models_parameter_counts():
    """The parameter counts of the released models (their safetensors totals), from the presets' shapes."""
    real = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-7b": 7_615_616_512, "qwen3-0.6b": 596_049_920,
            "qwen3-8b": 8_190_735_360, "phi3-mini": 3_821_079_552, "smollm2-135m": 134_515_008,
            "llama3.2-1b": 1_235_814_400, "mistral-nemo": 12_247_782_400, "qwen3-30b-a3b": 30_532_122_624,
            "mixtral-8x7b": 46_702_792_704}
    counts = {name: sum(math.prod(s) for n, s in expected_tensors(preset_config(name)).items()
                        if not n.startswith("rope_")) for name in real}
    assert counts == real


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_make_model_dry_run(cli, tmp_path, preset):
    code, out, err = cli("make-model", "--preset", preset, "--dry-run", "-o", tmp_path / "m.gguf")
    assert code == 0 and err == "" and not (tmp_path / "m.gguf").exists()
    assert out.startswith(f"would write {tmp_path / 'm.gguf'}: {preset} Q4_K_M, ")
    assert f"{len(expected_tensors(preset_config(preset)))} tensors" in out
    assert "format  tensors" in out and "F32" in out and "Q4_K" in out


def test_fan_in_weights(tmp_path):
    """weights="fan-in" draws as the reference fixtures are drawn: std gain / sqrt(row length) per role
    (attn_qkv's rows by the projection they belong to), biases at their projection's output spread (v's a
    tenth), and a tied table at 1 / sqrt(dim) with the head's gain in output_norm."""
    def stds(preset, **overrides):
        path = tmp_path / f"{preset}.gguf"
        plan_build(path, preset, "F32", weights="fan-in", overrides=overrides).write(progress=False)
        m = open_model(path)
        return m, lambda name: float(m.dequantize(name).std())

    m, std = stds("tiny-qwen2")  # dim 384, tied
    assert std("blk.0.attn_q.weight") == pytest.approx(1.5 / math.sqrt(384), rel=0.02)
    assert std("blk.1.ffn_down.weight") == pytest.approx(0.5 / math.sqrt(768), rel=0.02)
    assert std("token_embd.weight") == pytest.approx(1 / math.sqrt(384), rel=0.02)
    assert float(m.dequantize("output_norm.weight").mean()) == pytest.approx(12, rel=0.05)
    assert std("blk.0.attn_q.bias") == pytest.approx(1.5, rel=0.2)
    assert std("blk.0.attn_v.bias") == pytest.approx(0.1, rel=0.3)
    m, std = stds("tiny-phi3", qkv_bias="true")  # dim 256, untied; q|k|v rows 256, 256, 256
    assert std("token_embd.weight") == pytest.approx(1.0, rel=0.02)
    assert std("output.weight") == pytest.approx(12 / 16, rel=0.02)
    qkv = m.dequantize("blk.0.attn_qkv.weight")
    assert [float(qkv[r:r + 256].std()) for r in (0, 256, 512)] == pytest.approx([1.5 / 16, 1.5 / 16, 1 / 16], rel=0.03)
    bias = m.dequantize("blk.0.attn_qkv.bias")
    assert float(bias[512:].std()) < 0.2 < float(bias[:512].std())

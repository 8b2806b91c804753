"""The CPU target's kernel families: one module per family, each turning a lowered launch (plans/lower.py)
into Launch records of compiled host kernels (codegen/cpu/*.h), as codegen/families/ does for the GPUs.

A CPU launch is one C call (grid (1,)): the kernel fans its work out over the library's thread pool
itself (codegen/cpu/pool.h). Weights are read in place: a weight argument is
{"weight": name, "layout": "blocks"}, the tensor's bytes in the mapped GGUF as stored.
"""

# fused-graph op -> family module in codegen/cpu_families/
FAMILY_MODULE = {
    "embed": "embed",
    "rmsnorm": "norm", "rmsnorm_pack": "norm", "pack": "norm",
    "matmul": "matmul", "matmul_segmented": "matmul", "matmul_residual": "matmul",
    "rope_kv": "rope_kv", "norm_rope_kv": "rope_kv",
    "attention": "attention", "attention_partial": "attention", "attention_reduce": "attention",
    "attention_reduce_pack": "attention",
    "glu_pack": "glu",
    "add": "elementwise", "mul": "elementwise", "scale": "elementwise", "silu": "elementwise",
    "gelu_tanh": "elementwise", "softcap": "elementwise", "take_rows": "elementwise",
    "tail_argmax": "tail",
}

"""Compilation targets: how to build device code for each GPU architecture without the GPU.

NVIDIA targets build with nvcc into a fatbin holding the cubin and the PTX; AMD targets build with
clang-19 as HIP device-only code objects (no ROCm device libraries: kernels use compiler builtins
for their math). Families a target cannot run say so here, with the reason; the build gate accepts
nothing else without device code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    name: str  # sm_89, gfx1151, ...
    vendor: str  # "cuda" or "hip"
    wave: int
    unsupported: dict[str, str] = field(default_factory=dict)  # family -> why it has no kernel here

    @property
    def nvidia(self) -> bool:
        return self.vendor == "cuda"


TARGETS: dict[str, Target] = {
    "sm_89": Target("sm_89", "cuda", 32),
    "sm_90": Target("sm_90", "cuda", 32),
    "gfx1100": Target("gfx1100", "hip", 32),
    "gfx1151": Target("gfx1151", "hip", 32),
    "gfx942": Target("gfx942", "hip", 64, {
        "gemm_mma": "CDNA3 MFMA fragments are not written yet; prefill projections use the dot-product tile",
        "flash_attention": "CDNA3 MFMA fragments are not written yet; prefill attention uses the row kernel",
    }),
}

# Instruction classes a kernel may require, and how each shows in the disassembly of each vendor.
INSTRUCTIONS = {
    "dot4": {"cuda": ("IDP.4A",), "hip": ("v_dot4_i32_iu8", "v_dot4_i32_i8", "v_dot4c_i32_i8")},
    "load128": {"cuda": ("LDG.E.128",), "hip": ("global_load_b128", "global_load_dwordx4", "buffer_load_dwordx4")},
    "imma": {"cuda": ("IMMA.",), "hip": ("v_wmma_i32_16x16x16_iu8", "v_mfma_i32")},
    "hmma": {"cuda": ("HMMA.",), "hip": ("v_wmma_f32_16x16x16_f16", "v_mfma_f32")},
}


def target_for(arch: str) -> Target:
    return TARGETS[arch]

"""Kernel catalog and code generation: one templated CUDA/HIP source per kernel family
(codegen/kernels/), family modules that instantiate them for a plan's launches (codegen/families/),
and the build: render, compile with nvcc or clang-19, manifests, gates, cache (codegen/build.py)."""

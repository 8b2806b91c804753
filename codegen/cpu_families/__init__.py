"""The CPU target's kernel families: one module per family, each turning a lowered launch (plans/lower.py)
into Launch records of compiled host kernels (codegen/cpu/*.h), as codegen/families/ does for the GPUs;
core/op_traits.py MODULES names each kernel family's module.

A CPU launch is one C call (grid (1,)): the kernel fans its work out over the library's thread pool
itself (codegen/cpu/pool.h). Weights are read in place: a weight argument is
{"weight": name, "layout": "blocks"}, the tensor's bytes in the mapped GGUF as stored.
"""

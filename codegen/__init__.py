"""Kernel catalog, rendering and compiling for CUDA and HIP."""

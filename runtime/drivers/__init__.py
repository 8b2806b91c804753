"""The backends behind runtime/driver.py: cpu (NumPy twins), emu (a GPU plan's kernels on the host),
cuda, hip."""

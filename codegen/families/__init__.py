"""Kernel families for GPU targets: each module turns a lowered launch into kernel launches."""

"""Backend drivers, K/V cache, step executor, scheduler, sampler, Python API."""

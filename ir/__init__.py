"""The tensor IR: values, ops, tracer, printer, verifier, reference interpreter."""

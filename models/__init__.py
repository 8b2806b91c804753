"""Model input: GGUF reading and validation, weight formats, model configs, the synthetic-model builder."""

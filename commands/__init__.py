"""The `plan` commands: one module per verb, the only layer that joins the compiler, tuning and the runtime."""

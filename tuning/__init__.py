"""Measuring the planner's decisions: probes that time candidates through a driver and record verdicts in
the tune store (core/tune_store.py), which the compiler only reads."""

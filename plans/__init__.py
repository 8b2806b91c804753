"""Device facts, kernel choice, buffer planning, the plan file, and the `plan` CLI."""

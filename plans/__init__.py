"""The compiler's planning stage: lowering fused graphs to launches, buffer planning, kernel choice (from
the tune store's entries or a heuristic), and the compile pipeline that writes the plan file."""

"""What the checks are written with: the per-test case, guarded arenas, exact data, strategies,
the ops' reference twins, assertion helpers, and the one module that decides applicability."""

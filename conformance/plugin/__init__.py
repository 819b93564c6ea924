"""The pytest plugin that turns the check modules into a suite run (hooks.py is its entry point)."""

"""Example agents (importable from the repository root as ``examples.<name>``)."""

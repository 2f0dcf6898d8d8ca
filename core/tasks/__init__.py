"""Toy tasks shipped with tracerl (data generators, rewards and agents)."""

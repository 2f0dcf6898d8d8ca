"""The math agent of ``examples/math_agent``, written with Strands Agents' ``OpenAIModel``."""

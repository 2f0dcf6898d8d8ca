"""Samplers that plug into the gateway (see ``core.interfaces.Sampler``).

Defines (re-exported):

- ``ScriptedSampler``: returns preset token sequences; for tests, demos and benchmarks.
- ``encode_reply``: the token ids a model would emit for a text reply (text + EOS).
"""

from __future__ import annotations

from core.samplers.scripted import SamplerCall, ScriptedSampler, encode_reply

__all__ = ["SamplerCall", "ScriptedSampler", "encode_reply"]

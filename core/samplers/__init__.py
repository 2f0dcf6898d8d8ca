"""Samplers that plug into the gateway (see ``core.interfaces.Sampler``).

Defines (re-exported):

- ``ScriptedSampler``: returns preset token sequences; for tests, demos and benchmarks.
- ``encode_reply``: the token ids a model would emit for a text reply (text + EOS).
- ``VLLMSampler``, ``SGLangSampler``: token ids over HTTP to vLLM / SGLang servers
  (several URLs, sticky sessions, health checks, retries on connection errors).
- ``HttpSamplerConfig``, ``build_http_sampler``: their config and factory.
"""

from __future__ import annotations

from core.samplers.factory import build_http_sampler
from core.samplers.http_sampler import HttpSampler, HttpSamplerConfig
from core.samplers.scripted import SamplerCall, ScriptedSampler, encode_reply
from core.samplers.sglang import SGLangSampler
from core.samplers.vllm import VLLMSampler

__all__ = [
    "HttpSampler",
    "HttpSamplerConfig",
    "SGLangSampler",
    "SamplerCall",
    "ScriptedSampler",
    "VLLMSampler",
    "build_http_sampler",
    "encode_reply",
]

"""The factory for HTTP samplers: config in, ``VLLMSampler`` or ``SGLangSampler`` out.

It sits beside the classes it builds, not in their base module, so the base
imports no subclass.

Defines:

- ``build_http_sampler``: config (dataclass or dict) in, sampler out (``kind`` picks the class).
"""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from core.samplers.http_sampler import HttpSampler, HttpSamplerConfig
from core.samplers.sglang import SGLangSampler
from core.samplers.vllm import VLLMSampler

__all__ = ["build_http_sampler"]


def build_http_sampler(config: HttpSamplerConfig | dict[str, Any]) -> HttpSampler:
    """``VLLMSampler`` or ``SGLangSampler`` for ``config.kind``.

    Raises:
        ConfigError: unknown kind or a bad field.
    """
    if isinstance(config, dict):
        known = set(HttpSamplerConfig.__dataclass_fields__)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(f"unknown sampler keys {unknown!r}; known keys: {sorted(known)}")
        config = HttpSamplerConfig(**config)
    if config.kind == "sglang":
        return SGLangSampler(config)
    if config.kind == "vllm":
        return VLLMSampler(config)
    config.validate()  # raises, naming the kinds
    raise AssertionError("unreachable")

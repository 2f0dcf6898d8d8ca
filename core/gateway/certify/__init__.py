"""The chat-template certifier: are a model's traces exact, before it trains?

Exports:

- ``certify`` / ``acertify``: run the battery (``core.gateway.certify.cases``) through the
  real gateway with the model's tokenizer and template, and judge each case against
  transformers' own ``apply_chat_template`` (``core.gateway.certify.run``).
- ``Certificate``, ``CaseResult``, ``TokenDiff``: what it found (``core.gateway.certify.report``).
- ``cached_certificate``: a certificate from the cache, or certified and cached
  (``core.gateway.certify.cache``).
- ``certify_on_start``, ``certify_model_on_start``, ``check_certificate``: what a run does on start
  (train, eval, the verl and slime launchers): certify, write the certificate, refuse a failing
  template unless ``gateway.allow_uncertified_template`` (``core.gateway.certify.gate``).

Command line: ``python -m core.gateway certify MODEL_DIR_OR_NAME`` (docs/gateway.md).
"""

from __future__ import annotations

from core.gateway.certify.cache import cache_dir, cached_certificate
from core.gateway.certify.gate import (
    CERTIFICATE_FILE,
    certify_model_on_start,
    certify_on_start,
    check_certificate,
)
from core.gateway.certify.report import CERTIFIER_VERSION, CaseResult, Certificate, TokenDiff
from core.gateway.certify.run import (
    acertify,
    certified_settings,
    certify,
    template_hash,
    tokenizer_hash,
)

__all__ = [
    "CERTIFICATE_FILE",
    "CERTIFIER_VERSION",
    "CaseResult",
    "Certificate",
    "TokenDiff",
    "acertify",
    "cache_dir",
    "cached_certificate",
    "certified_settings",
    "certify",
    "certify_model_on_start",
    "certify_on_start",
    "check_certificate",
    "template_hash",
    "tokenizer_hash",
]

"""Certificates cached by what they certify, so a run certifies a template once.

Defines:

- ``cache_dir``: ``$TRACERL_CACHE_DIR/certificates``, else ``$XDG_CACHE_HOME/tracerl/certificates``,
  else ``~/.cache/tracerl/certificates``.
- ``certificate_key``: the SHA-256 of the template, the tokenizer, the gateway settings, the
  end-of-turn ids and the certifier version: anything that changes a verdict changes it.
- ``cached_certificate``: the certificate for that key from this process's memory, then from
  the cache directory, else certified now and written there (atomically: runs share it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from core.gateway.certify.report import CERTIFIER_VERSION, Certificate
from core.gateway.certify.run import acertify, certified_settings, template_hash, tokenizer_hash
from core.gateway.config import GatewayConfig

__all__ = ["cache_dir", "cached_certificate", "certificate_key"]

_MEMORY: dict[str, Certificate] = {}
"""Certificates made or read in this process, by key (tests start many runs in one process)."""


def cache_dir() -> Path:
    """Where certificates are cached."""
    base = os.environ.get("TRACERL_CACHE_DIR")
    if base:
        return Path(base) / "certificates"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tracerl" / "certificates"


def certificate_key(tokenizer: Any, config: GatewayConfig | None, end_of_turn_ids: tuple[int, ...]) -> str:
    """The key a certificate is cached under."""
    data = {
        "version": CERTIFIER_VERSION,
        "template": template_hash(tokenizer),
        "tokenizer": tokenizer_hash(tokenizer),
        "settings": certified_settings(config),
        "end_of_turn": sorted(int(i) for i in end_of_turn_ids),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


async def cached_certificate(
    tokenizer: Any, *, config: GatewayConfig | None = None, end_of_turn_ids: tuple[int, ...] = (),
    directory: Path | None = None,
) -> tuple[Certificate, bool]:
    """(certificate, whether it came from a cache) for ``tokenizer`` under ``config``.

    Args:
        tokenizer: The model's tokenizer, chat template included.
        config: The gateway settings the run uses.
        end_of_turn_ids: Every id the run's gateway stops on (``Gateway.end_of_turn_ids``).
        directory: Cache directory; ``cache_dir()`` when None. A cache that cannot be
            written is skipped (the certificate is still returned).
    """
    key = certificate_key(tokenizer, config, end_of_turn_ids)
    if key in _MEMORY:
        return _MEMORY[key], True
    path = (directory or cache_dir()) / f"{key}.json"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):  # missing or stale: certify again
        cert = Certificate.from_json(path.read_text(encoding="utf-8"))
        _MEMORY[key] = cert
        return cert, True
    cert = await acertify(tokenizer, config=config, end_of_turn_ids=end_of_turn_ids)
    _MEMORY[key] = cert
    with contextlib.suppress(OSError):  # a read-only home still trains, it certifies each start
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cert-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(cert.to_json())
        os.replace(tmp, path)
    return cert, False

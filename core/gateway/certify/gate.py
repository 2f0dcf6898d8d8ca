"""Certifying a run's chat template before it starts, and refusing one whose traces would not be exact.

Defines:

- ``check_certificate``: refuse a failing certificate (``ConfigError`` naming the failing case, its
  first differing token and ``gateway.allow_uncertified_template``), or the line to print.
- ``certify_on_start``: certify (cached), write ``CERTIFICATE_FILE`` into the run's directory, refuse
  or print the line. ``python -m core.train`` (core-driven backends), ``python -m core.eval`` and the
  verl and slime launchers (``certify_model_on_start``) all start with it, with one cache and one override.
- ``certify_model_on_start``: the same for a launcher that has a model name or directory, not a
  gateway (verl, slime: their workers build the gateway after the launch).

Why before the start: a template the gateway cannot trace exactly trains the model on contexts it
never sees when served, and nothing in the run's metrics shows it; GPU hours are spent first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.gateway.certify.cache import cached_certificate
from core.gateway.certify.report import Certificate
from core.gateway.config import GatewayConfig

__all__ = ["CERTIFICATE_FILE", "certify_model_on_start", "certify_on_start", "check_certificate"]

CERTIFICATE_FILE = "template_certificate.json"
"""The certificate's name in a run's (or an evaluation's) directory."""


def check_certificate(cert: Certificate, *, allow: bool) -> str | None:
    """Refuse a chat template whose traces would not be exact; returns the line to print
    (a summary when some cases fork, a warning when a failing template is allowed), or None.

    Raises:
        ConfigError: a case fails and ``gateway.allow_uncertified_template`` is off.
    """
    if cert.verdict == "fails":
        bad = cert.failing()
        name = f"case {bad[0].name!r} ({bad[0].what})" if bad else "the end-of-turn check"
        detail = bad[0].detail if bad else "no token id stops generation (set the eos token or generation config)"
        if not allow:
            names = ", ".join(c.name for c in bad)
            raise ConfigError(
                f"the model's chat template does not certify: {name} fails: {detail}"
                + (f" (failing cases: {names})" if len(bad) > 1 else "")
                + ". Traces recorded with it would not be what the template renders, so the model would be "
                "trained on contexts it never sees when served. See the table with `python -m core.gateway "
                "certify MODEL`, fix the template, or set gateway.allow_uncertified_template=true to train anyway"
            )
        return f"warning: training with an uncertified chat template (gateway.allow_uncertified_template): {name} fails: {detail}"
    if cert.verdict == "forks":
        return cert.summary()
    return None


async def certify_on_start(
    tokenizer: Any, config: GatewayConfig, *, out_dir: Path, end_of_turn_ids: tuple[int, ...] = ()
) -> Certificate:
    """Certify ``tokenizer``'s template under ``config`` (cached by what it certifies), write the
    certificate to ``out_dir / CERTIFICATE_FILE`` and print the summary or warning line.

    Raises:
        ConfigError: the template fails and ``config.allow_uncertified_template`` is off.
    """
    cert, _ = await cached_certificate(tokenizer, config=config, end_of_turn_ids=end_of_turn_ids)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CERTIFICATE_FILE).write_text(cert.to_json(), encoding="utf-8")
    line = check_certificate(cert, allow=config.allow_uncertified_template)
    if line is not None:
        print(line, file=sys.stderr if line.startswith("warning") else sys.stdout, flush=True)
    return cert


def certify_model_on_start(model: str, gateway: Any, *, out_dir: Path, dry_run: bool = False) -> Certificate | None:
    """``certify_on_start`` for a launcher: the tokenizer of ``model`` (``tiny``, a model directory or a
    cached Hugging Face name, as ``core.tokenizer.load_tokenizer`` loads it, as the launched workers
    do), under ``gateway`` (the composed ``gateway`` config), with the end-of-turn ids the workers'
    gateway reads from that tokenizer (and the ``generation_config.json`` beside it).

    A tokenizer that cannot be loaded here (a dry run prepared away from the cluster's model
    files) is not certified: a dry run prints a note and returns None; a launch is refused unless
    ``gateway.allow_uncertified_template``, which warns and returns None.

    Raises:
        ConfigError: the template fails, or cannot be loaded for a launch, and
            ``gateway.allow_uncertified_template`` is off.
    """
    import asyncio

    from omegaconf import OmegaConf

    from core.tokenizer import end_of_turn_ids, load_tokenizer

    settings = OmegaConf.to_container(gateway, resolve=True) if OmegaConf.is_config(gateway) else dict(gateway)
    config = GatewayConfig(**settings)  # type: ignore[arg-type]
    try:
        tokenizer = load_tokenizer(model)
    except Exception as exc:
        why = f"cannot load the tokenizer of {model!r} here to certify its chat template: {type(exc).__name__}: {exc}"
        if dry_run:
            print(f"note: {why} (a launch from here refuses it)", file=sys.stderr, flush=True)
            return None
        if not config.allow_uncertified_template:
            raise ConfigError(f"{why}. Launch where the model's files are, or set "
                              "gateway.allow_uncertified_template=true to train without a certificate") from exc
        print(f"warning: training with an uncertified chat template (gateway.allow_uncertified_template): {why}",
              file=sys.stderr, flush=True)
        return None
    ends = end_of_turn_ids(tokenizer)  # as the workers' Gateway reads them (generation_config.json beside it)
    return asyncio.run(certify_on_start(tokenizer, config, out_dir=out_dir, end_of_turn_ids=ends))

"""``python -m core.gateway certify MODEL``: certify a model's chat template from the command line.

Prints the table (``Certificate.table``), writes the certificate as JSON (``--out``) and
exits 0 when every case holds or forks, 1 when one fails, 2 on bad input. ``MODEL`` is
``tiny`` (the offline tiny tokenizer), a model directory or a Hugging Face name already in
the local cache (loaded without torch, never downloaded by this command), or, in a source
checkout, the name of a test fixture family (``tests/gateway/families``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m core.gateway certify",
        description="Certify a model's chat template: run synthetic conversations through the gateway and "
                    "check every trained token against transformers' apply_chat_template.",
    )
    p.add_argument("model", help="'tiny', a model directory, a cached Hugging Face name, or a fixture family name")
    p.add_argument("--chat-template", default="", metavar="FILE",
                   help="certify this Jinja template instead of the tokenizer's own (an edited template)")
    p.add_argument("--tool-parser", default="auto", help="gateway.tool_parser (default auto)")
    p.add_argument("--reasoning-parser", default="auto", help="gateway.reasoning_parser (default auto)")
    p.add_argument("--chat-template-kwargs", default="{}", metavar="JSON",
                   help="gateway.chat_template_kwargs, e.g. '{\"enable_thinking\": false}'")
    p.add_argument("--keep-reasoning", action="store_true", help="gateway.keep_reasoning")
    p.add_argument("--out", default="template-certificate.json", metavar="FILE",
                   help="where the certificate (JSON) is written ('-' prints it instead of the table)")
    return p


def _fixture(name: str) -> tuple[Any, Any] | None:
    """(tokenizer, generation config) of a test fixture family, in a source checkout."""
    import importlib

    try:
        families = importlib.import_module("tests.gateway.families")
    except ImportError:
        return None
    family = families.FAMILIES.get(name)
    if family is None:
        return None
    generation = {"eos_token_id": list(family.generation_eos)} if family.generation_eos else None
    return families.load(name), generation


def load_model(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """(tokenizer, generation config or None, template kwargs the fixture is tested with)."""
    if name == "tiny":
        from core.tokenizer import build_tiny_tokenizer

        return build_tiny_tokenizer(), None, {}
    path = Path(name)
    if not path.exists():
        found = _fixture(name)
        if found is not None:
            import importlib

            kwargs = dict(importlib.import_module("tests.gateway.families").FAMILIES[name].kwargs)
            return found[0], found[1], kwargs
    from core.tokenizer_export import load_tokenizer_without_torch

    tok = load_tokenizer_without_torch(name)
    generation = None
    config = path / "generation_config.json"
    if config.is_file():
        generation = json.loads(config.read_text(encoding="utf-8"))
    return tok, generation, {}


def main(argv: list[str]) -> int:
    """Entry point of the ``certify`` subcommand; returns the exit code."""
    from core.errors import ConfigError
    from core.gateway.certify.run import certify
    from core.gateway.config import GatewayConfig

    args = _parser().parse_args(argv)
    try:
        kwargs = json.loads(args.chat_template_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        print(f"--chat-template-kwargs must be a JSON object: {exc}", file=sys.stderr)
        return 2
    try:
        tok, generation, fixture_kwargs = load_model(args.model)
        if args.chat_template:
            tok.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
        config = GatewayConfig(
            tool_parser=args.tool_parser, reasoning_parser=args.reasoning_parser,
            chat_template_kwargs={**fixture_kwargs, **kwargs}, keep_reasoning=args.keep_reasoning,
        )
        cert = certify(tok, config=config, generation_config=generation)
    except (ConfigError, OSError) as exc:
        print(f"cannot certify {args.model!r}: {exc}", file=sys.stderr)
        return 2
    if args.out == "-":
        print(cert.to_json())
    else:
        Path(args.out).write_text(cert.to_json(), encoding="utf-8")
        print(cert.table())
        print(f"certificate written to {args.out}")
    return 1 if cert.verdict == "fails" else 0

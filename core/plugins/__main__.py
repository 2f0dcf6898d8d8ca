"""``python -m core.plugins``: list installed backends and runtimes with their origin.

``--check`` is the command a plugin author and a CI job run: it imports every
plugin, validates every registration and config node, and exits 1 naming each
broken one. ``new NAME`` writes a working plugin distribution to start from.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from core.plugins.manager import DISABLE_ENV, Plugins, debug_enabled, load_plugins
from core.plugins.registry import PluginProblem


def _source(plugins: Plugins, group: str, name: str) -> str:
    registry: Any = {"backend": plugins.backends, "runtime": plugins.runtimes, "reward": plugins.rewards}[group]
    origin = registry.origin(name)
    if origin.distribution:
        return f"{origin.distribution} {origin.version}"
    return f"built in ({origin.plugin})"


def _print_problem(problem: PluginProblem, prefix: str, out: TextIO) -> None:
    print(f"{prefix}{problem.message}", file=out)
    if problem.detail and debug_enabled():
        print(problem.detail, file=out)


def _listing(plugins: Plugins) -> None:
    for title, group, registry in (
        ("backends", "backend", plugins.backends),
        ("runtimes", "runtime", plugins.runtimes),
        ("rewards", "reward", plugins.rewards),
    ):
        print(f"{title}:")
        if not len(registry) and not registry.problems():
            print("  (none installed)")
        for spec in registry:
            kind = f" [{spec.kind}]" if hasattr(spec, "kind") else ""
            line = f"  {spec.name:<12}{kind:<10} {_source(plugins, group, spec.name)}"
            if spec.description:
                line += f"  - {spec.description}"
            print(line)
        for problem in registry.problems():
            print(f"  {problem.names[0]:<12}{'':<10} BROKEN: {problem.message}")
    if plugins.load_problems:
        print("plugins that failed to load:")
        for problem in plugins.load_problems:
            _print_problem(problem, "  ", sys.stdout)
    if plugins.blocked:
        print(f"blocked by {DISABLE_ENV}:")
        for blocked in plugins.blocked:
            print(f"  {blocked.origin.describe()}")
    for warning in plugins.unmatched_blocks:
        print(f"warning: {warning}", file=sys.stderr)
    if plugins.problems and not debug_enabled():
        print("Run `python -m core.plugins --check` to fail on these; TRACERL_DEBUG=1 shows tracebacks.")


def _check(plugins: Plugins) -> int:
    for problem in plugins.problems:
        _print_problem(problem, "error: ", sys.stderr)
    for warning in plugins.unmatched_blocks:
        print(f"warning: {warning}", file=sys.stderr)
    if plugins.blocked:
        names = ", ".join(b.origin.plugin for b in plugins.blocked)
        print(f"not checked (blocked by {DISABLE_ENV}): {names}")
    if plugins.problems:
        culprits = sorted({p.origin.plugin for p in plugins.problems})
        print(
            f"{len(plugins.problems)} problem(s) in plugin(s) {', '.join(culprits)}",
            file=sys.stderr,
        )
        return 1
    print(
        f"ok: {len(plugins.backends)} backend(s), {len(plugins.runtimes)} runtime(s) and "
        f"{len(plugins.rewards)} reward(s); "
        "every plugin imports and every registration and config node is valid"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (``--check``: 1 when anything is broken)."""
    parser = argparse.ArgumentParser(
        prog="python -m core.plugins",
        description="List installed tracerl backends and runtimes, check them, or start a new plugin.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="import every plugin, validate every registration and config node; exit 1 naming each broken one",
    )
    sub = parser.add_subparsers(dest="command")
    new = sub.add_parser("new", help="write a working plugin distribution (with a passing conformance test)")
    new.add_argument("name", help="the runtime or backend name, e.g. mypool (lower case)")
    new.add_argument("--kind", choices=("runtime", "backend"), default="runtime")
    new.add_argument("--dest", default=".", help="folder to write tracerl-NAME/ into")
    args = parser.parse_args(argv)
    if args.command == "new":
        from core.plugins.scaffold import main as scaffold_main

        return scaffold_main(args.name, args.dest, args.kind)
    plugins = load_plugins()
    if args.check:
        return _check(plugins)
    _listing(plugins)
    return 0


if __name__ == "__main__":
    sys.exit(main())

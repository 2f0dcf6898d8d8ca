"""``python -m core.plugins``: list installed backends and runtimes with their origin."""

from __future__ import annotations

import sys

from core.errors import PluginError
from core.plugins.manager import load_plugins


def main() -> int:
    try:
        plugins = load_plugins()
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for title, registry in (("backends", plugins.backends), ("runtimes", plugins.runtimes)):
        print(f"{title}:")
        if not len(registry):
            print("  (none installed)")
        for spec in registry:
            origin = registry.origin(spec.name)
            source = (
                f"{origin.distribution} {origin.version}"
                if origin.distribution
                else f"built in ({origin.plugin})"
            )
            kind = f" [{spec.kind}]" if hasattr(spec, "kind") else ""
            line = f"  {spec.name:<12}{kind:<10} {source}"
            if spec.description:
                line += f"  - {spec.description}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

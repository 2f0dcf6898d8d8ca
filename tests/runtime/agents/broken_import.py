"""An agent module that fails at import: its server exits before listening (a fault under test)."""

from __future__ import annotations

raise ImportError("this agent needs a package that is not installed (on purpose)")

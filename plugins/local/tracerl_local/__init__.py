"""tracerl-local: the single-machine torch backend (``backend=local``)."""

from __future__ import annotations

__version__ = "0.1.0"

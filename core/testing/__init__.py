"""Test support for tracerl and for third-party backend authors.

- ``core.testing.pytest_plugin``: fixtures, loaded with ``-p core.testing.pytest_plugin``.
- ``core.testing.conformance``: the backend conformance suite (``BackendConformance``).
"""

from __future__ import annotations

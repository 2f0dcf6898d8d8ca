"""tracerl backend for verl: our runtime and gateway inside stock verl."""

from __future__ import annotations

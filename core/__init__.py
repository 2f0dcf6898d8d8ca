"""tracerl core: contracts, plugin registry, gateway, runtimes and the training loop.

Importing ``core`` is cheap: no torch, transformers, boto3 or trainer SDKs.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

"""The gateway harness fixtures (``tests/gateway/conftest.py``) for the fault tests that drive a gateway alone."""

from tests.gateway.conftest import harness, make_harness

__all__ = ["harness", "make_harness"]

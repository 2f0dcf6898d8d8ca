"""Tests of ``runtime=ray`` on loopback Ray clusters (marker ``ray``; see ``conftest.py``)."""

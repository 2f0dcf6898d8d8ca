"""``python -m core.view RUN_DIR``: a run's dashboard and token-level trajectory viewer.

Reads ``metrics.jsonl`` and the trace files the training loop stores
(``core.rundir.traces``), serves one offline page on loopback (``server``), or
writes it as one self-contained file (``--static``). See docs/viewer.md.
"""

from core.view.data import RunData, find_run_dir
from core.view.page import render_page
from core.view.server import ViewServer

__all__ = ["RunData", "ViewServer", "find_run_dir", "render_page"]

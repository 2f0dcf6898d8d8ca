"""An agent module that blocks at import: its server never listens (a fault under test)."""

from __future__ import annotations

import time

time.sleep(3600)

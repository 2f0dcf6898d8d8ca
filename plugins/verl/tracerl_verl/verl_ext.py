"""The module verl imports in every process (``VERL_USE_EXTERNAL_MODULES=tracerl_verl.verl_ext``).

Registers the ``tracerl_sync`` trainer mode and tracerl's advantage
estimators (``tracerl_verl.advantages``: a rollout counts once, a lone rollout
gets 0), and with ``TRACERL_VERL_CPU=1`` the test-only CPU shims (``tracerl_verl.cpu``): a CPU platform, the FSDP
engine for device ``cpu``, and the ``tracerl_cpu`` rollout replica served by
the local backend's sampler. The platform goes first: importing verl's
trainer modules already asks the platform for its device name.
"""

from __future__ import annotations

import os

if os.environ.get("TRACERL_VERL_CPU") == "1":
    from tracerl_verl.cpu import install

    install()

from tracerl_verl import advantages, trainer_mode  # noqa: E402,F401  (registers tracerl_sync)

advantages.install()

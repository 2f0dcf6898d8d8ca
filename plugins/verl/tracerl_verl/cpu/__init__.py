"""Test-only shims that run stock verl 0.9.1 end to end on a CPU-only machine.

Defines ``install()``, called by ``tracerl_verl.verl_ext`` in every verl
process when ``TRACERL_VERL_CPU=1`` (``backend.device=cpu``). Not for
training: they exist so CI can run verl's real trainer, Ray placement,
agent-loop workers and weight sync on 2 cores.

- ``platform``: a ``cpu`` entry in verl's platform registry (public API).
- ``replica``: rollout ``tracerl_cpu``, a replica whose server is a Ray actor
  serving the policy with ``tracerl-local``'s batching sampler (public API:
  ``RolloutReplicaRegistry``).
- ``hybrid``: the in-trainer rollout adapter that pushes weights to that
  server, the FSDP engine registered for device ``cpu`` (public API), and two
  patches of private verl names (each names the verl line it works around).

Guarded: ``install`` refuses any verl but 0.9.1, because the patches target
that version's internals. See docs/research/verl-cpu.md for the findings.
"""

from __future__ import annotations

SUPPORTED_VERL = "0.9.1"
_installed = False


def install() -> None:
    """Register the CPU platform, rollout and engine (idempotent).

    Raises:
        RuntimeError: verl is not 0.9.1 (the patched internals may have moved).
    """
    global _installed
    if _installed:
        return
    import verl

    if verl.__version__ != SUPPORTED_VERL:
        raise RuntimeError(
            f"tracerl's CPU shims support verl {SUPPORTED_VERL} only, found {verl.__version__}; "
            "re-check tracerl_verl/cpu/hybrid.py against the new verl before bumping"
        )
    from tracerl_verl.cpu import hybrid, platform, replica

    platform.register()
    replica.register()
    hybrid.register()
    _installed = True

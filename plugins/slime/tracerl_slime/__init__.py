"""tracerl's slime backend: slime's trainer drives, our gateway and runtime roll out.

Public entry points slime loads by dotted path:

- ``tracerl_slime.generate.generate``: ``--custom-generate-function-path``.
- ``tracerl_slime.rewards.post_process_rewards``: ``--custom-reward-post-process-path``.

``python -m core.train backend=slime`` builds the launch (``tracerl_slime.backend``).
"""

from __future__ import annotations

__all__: list[str] = []

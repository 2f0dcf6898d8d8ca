"""Hook specifications: the whole contract between core and its plugins.

A plugin is a module (or object) with functions named after these hooks and
marked with ``core.plugins.hookimpl``; it ships in its own distribution and is
found through the ``tracerl`` entry-point group::

    [project.entry-points.tracerl]
    mybackend = "tracerl_mybackend.plugin"

Hooks are synchronous and only *register* things; the registered objects carry
the async sampling, training and rollout methods. Implementations may accept
any subset of a hook's arguments, so adding an argument later is safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from core.plugins.registry import BackendRegistry, RewardRegistry, RuntimeRegistry

PROJECT_NAME = "tracerl"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

# -------------------------------------------------------------------------
# Registration hooks: called once, when the plugin manager is built, before
# the Hydra config is composed.
# -------------------------------------------------------------------------


@hookspec
def tracerl_register_backends(registry: BackendRegistry) -> None:
    """Register training backends (``backend=<name>``).

    Called once per plugin when ``core.plugins.get_plugin_manager`` builds the
    registry, before Hydra composes the config. Each plugin calls
    ``registry.add(BackendSpec(...))``; the spec's ``config`` becomes the
    Hydra node ``backend/<name>``, so no one edits ``conf/``.

    :param registry: The backend registry; add to it, do not replace it.
    :returns: Nothing; results are collected through ``registry``.

    .. versionadded:: 0.1

    Called for every plugin. A name registered twice, or a config whose ``name``
    differs, is recorded against that name (a run selecting it fails naming the
    plugins) and listed by ``python -m core.plugins``; other names stay usable.
    """


@hookspec
def tracerl_register_runtimes(registry: RuntimeRegistry) -> None:
    """Register rollout runtimes (``runtime=<name>``).

    Called once per plugin when the plugin manager is built, like
    ``tracerl_register_backends``. Each spec's ``config`` becomes the Hydra
    node ``runtime/<name>``.

    :param registry: The runtime registry; add to it, do not replace it.
    :returns: Nothing; results are collected through ``registry``.

    .. versionadded:: 0.1

    Called for every plugin; core registers its own runtimes (``local``) the same way.
    """


@hookspec
def tracerl_register_rewards(registry: RewardRegistry) -> None:
    """Register trainer-side reward functions (``reward=<name>``).

    Called once per plugin when the plugin manager is built, like
    ``tracerl_register_backends``. Each spec's ``config`` becomes the Hydra node
    ``reward/<name>``; its factory returns a ``core.rewards.RewardFunction`` that
    scores finished rollouts (one group at a time) in the training loop and in
    ``python -m core.eval``.

    :param registry: The reward registry; add to it, do not replace it.
    :returns: Nothing; results are collected through ``registry``.

    .. versionadded:: 0.2

    Called for every plugin; core registers its own rewards (``agent``, ``match``,
    ``math``, ``judge``) the same way.
    """

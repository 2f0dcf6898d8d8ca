"""Exceptions raised by tracerl.

Every error derives from ``TracerlError`` and also from the stdlib exception of
its category, so ``except ValueError`` keeps working for callers that know
nothing of tracerl::

    TracerlError
    ├── ConfigError (ValueError)          bad or missing configuration
    │   └── BackendNotFoundError (LookupError)  backend=<name> is not installed
    ├── PluginError (RuntimeError)        a plugin failed to load or register
    ├── SamplerError (RuntimeError)       the sampling backend failed
    │   └── ContextLengthError            the prompt does not fit the model's context
    ├── TrainingError (RuntimeError)      a training primitive failed
    ├── RuntimeStartError (RuntimeError)  a rollout runtime could not start
    └── RunAborted (RuntimeError)         a guard stopped a training run

To add one: subclass the closest category, pass context as keyword arguments,
and keep it picklable (store only plain values, call ``super().__init__(msg)``).
A message says what failed, shows the offending value with ``repr`` and says
how to fix it.
"""

from __future__ import annotations

__all__ = [
    "BackendNotFoundError",
    "ConfigError",
    "ContextLengthError",
    "PluginError",
    "RunAborted",
    "RuntimeStartError",
    "SamplerError",
    "TracerlError",
    "TrainingError",
]


class TracerlError(Exception):
    """Base of every tracerl exception."""


class ConfigError(TracerlError, ValueError):
    """The configuration is invalid or incomplete."""


class BackendNotFoundError(ConfigError, LookupError):
    """``backend=<name>`` names a backend that is not installed."""

    def __init__(self, message: str, *, name: str = "", installed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.installed = installed

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_backend_not_found, (str(self), self.name, self.installed))


def _rebuild_backend_not_found(
    message: str, name: str, installed: tuple[str, ...]
) -> BackendNotFoundError:
    return BackendNotFoundError(message, name=name, installed=installed)


class PluginError(TracerlError, RuntimeError):
    """A plugin could not be loaded or registered something invalid."""


class SamplerError(TracerlError, RuntimeError):
    """The sampling backend failed to produce tokens."""


class ContextLengthError(SamplerError):
    """The prompt does not fit the model's context; the gateway answers it with a 400
    ``context_length_exceeded`` (not a retryable sampler failure), naming ``setting``."""

    def __init__(self, message: str, *, prompt_tokens: int = 0, context: int = 0, setting: str = "") -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        """Tokens in the refused prompt."""
        self.context = context
        """The model's context length."""
        self.setting = setting
        """Where the context length comes from, e.g. ``backend.tiny.max_position_embeddings``."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_context_length, (str(self), self.prompt_tokens, self.context, self.setting))


def _rebuild_context_length(message: str, prompt_tokens: int, context: int, setting: str) -> ContextLengthError:
    return ContextLengthError(message, prompt_tokens=prompt_tokens, context=context, setting=setting)


class TrainingError(TracerlError, RuntimeError):
    """A training primitive (forward_backward, optim_step, save/load) failed."""


class RuntimeStartError(TracerlError, RuntimeError):
    """A rollout runtime could not start (agent never listened, bad command...)."""


class RunAborted(TracerlError, RuntimeError):
    """A guard stopped the training run (canary failed, failure rate too high)."""

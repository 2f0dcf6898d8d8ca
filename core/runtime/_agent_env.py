"""The environment an agent process gets: an allowlist, never the trainer's whole one.

Agents run code the model writes; the trainer's environment holds the judge key,
cloud and W&B credentials. An agent process sees only the names below, the names
``runtime.pass_env`` lists, and ``task.agent_env`` (set explicitly by the operator).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

ALLOWED = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "TZ",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TMPDIR",
    "TMP",
    "TEMP",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "PYTHONIOENCODING",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "SYSTEMROOT",
    "TRACERL_DEBUG",
    "TRACERL_AGENT_THREADS",
    "TRACERL_DISABLE_PLUGINS",
    "TRACERL_DISABLE_PLUGIN_AUTOLOAD",
)
"""Names (``*`` globs) of the trainer's environment every agent process inherits:
what a Python process needs to start, find its packages, speak TLS and format text."""

S3_CHANNEL = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
"""Added with ``result_channel=s3``: the agent writes its result to S3 itself."""


def agent_environment(
    parent: Mapping[str, str],
    *,
    explicit: Mapping[str, str] | None = None,
    pass_env: Iterable[str] = (),
) -> dict[str, str]:
    """The allowlisted part of ``parent``, plus ``pass_env`` names (globs), plus ``explicit``.

    Args:
        parent: The trainer's (or Ray actor's) environment.
        explicit: ``task.agent_env``: set as given, over anything inherited.
        pass_env: More names (``*`` globs) of ``parent`` to pass (``runtime.pass_env``).
    """
    patterns = [*ALLOWED, *pass_env]
    env = {k: v for k, v in parent.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    env.update(explicit or {})
    return env

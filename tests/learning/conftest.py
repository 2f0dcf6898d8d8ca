"""Overlap test_learning.py's training runs with the rest of the session.

The learning test's runs are subprocesses that need minutes of CPU while the
rest of the session (``python -m pytest -m long``) mostly keeps one core busy.
When its learning tests are selected, they move to the end of the session and
their runs start as soon as collection ends, so on a 2-core machine they use
the core the other tests leave idle; by the time the learning tests come up,
most of the training is done. Under pytest-xdist (``-n``) they move to the
front instead (``pytest_collection_modifyitems``). What the tests assert is
unchanged. (Not at a lower priority: on a machine shared with other jobs a
niced run starves, and the session then waits for it at the end.)
"""

from __future__ import annotations

from types import ModuleType

import pytest

LEARNING_MODULE = "test_learning.py"
LEARNING_FIXTURE = "runs"


def _learning(item: pytest.Item) -> bool:
    return item.path.name == LEARNING_MODULE and LEARNING_FIXTURE in getattr(item, "fixturenames", ())


def _module(items: list[pytest.Item]) -> ModuleType | None:
    for item in items:
        if _learning(item):
            return item.module  # type: ignore[attr-defined,no-any-return]
    return None


def _xdist_worker(config: pytest.Config) -> bool:
    """This process is one of pytest-xdist's workers (``-n``), each of which collects every test."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The learning tests last (in their own order): they wait for runs started at collection end.

    Under pytest-xdist they go first instead. Every worker collects every test, so none can
    start the runs at collection; the worker that is handed this module starts them from the
    ``runs`` fixture, and the earlier that is, the more of the session they overlap.
    """
    learning = [item for item in items if _learning(item)]
    if not learning:
        return
    rest = [item for item in items if not _learning(item)]
    items[:] = learning + rest if _xdist_worker(config) else rest + learning


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or _xdist_worker(session.config):
        return
    module = _module(session.items)
    if module is not None:
        # the session's tmp_path_factory (no fixture can be requested before the first test)
        factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
        module.start_learning_runs(factory.mktemp("learning"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    module = _module(session.items)
    if module is not None:
        module.stop_learning_runs()

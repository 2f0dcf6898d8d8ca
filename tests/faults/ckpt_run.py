"""A training run in its own process, to be killed with SIGKILL mid-checkpoint.

``python tests/faults/ckpt_run.py <hydra overrides>`` runs ``Trainer`` with the
fake backend, as ``python -m core.train`` would with it installed. When
``FAULT_HANG_SAVE_STEP=N`` is set, the backend's ``save_state`` for step N writes
its files, then writes ``FAULT_MARK`` and never returns: the checkpoint directory
exists, its backend state is on disk, its ``trainer_state.json`` is not. The test
kills the process there, which is a kill during a checkpoint write made
deterministic.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from core.plugins import load_plugins
from core.testing.fakes import FakeBackend, compose, fake_backend_plugin
from core.trainer.loop import Trainer


def _hang_in_save(step: int, mark: Path) -> None:
    original = FakeBackend.save_state

    async def save_state(self: FakeBackend, path: str) -> str:
        where = await original(self, path)
        if f"step_{step:06d}" in path:
            mark.write_text(path)
            await asyncio.sleep(3600)
        return where

    FakeBackend.save_state = save_state  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if os.environ.get("FAULT_HANG_SAVE_STEP"):
        _hang_in_save(int(os.environ["FAULT_HANG_SAVE_STEP"]), Path(os.environ["FAULT_MARK"]))
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    return asyncio.run(Trainer(compose(argv, plugins), plugins).run())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

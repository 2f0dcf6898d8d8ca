"""Weights on disk in the layout inference engines load: Hugging Face ``config.json`` + safetensors.

Defines ``export_weights`` (what ``LocalBackend.export_weights`` writes for a
fleet of vLLM/SGLang servers to load) and ``load_weights`` (what
``python -m tracerl_local.serve`` does on ``/update_weights_from_disk`` or a
vLLM ``reload_weights``). A small ``tracerl_weights.json`` beside the weights
carries the weight version; engines ignore the extra file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["VERSION_FILE", "WeightsLoadError", "export_weights", "load_weights", "read_version"]

VERSION_FILE = "tracerl_weights.json"


class WeightsLoadError(ValueError):
    """A weights directory that cannot be loaded into the served model (message says why)."""


def export_weights(model: Any, path: str | Path, version: int) -> str:
    """Write ``model`` (a transformers model) to directory ``path``: config.json + model.safetensors.

    Written to a sibling temporary directory first and renamed, so a server
    never reads a half-written directory. Returns the absolute path.
    """
    out = Path(path).resolve()
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    from safetensors.torch import save_file

    tmp.mkdir(parents=True)
    model.config.save_pretrained(str(tmp))
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the engines tie it back, as transformers does
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / VERSION_FILE).write_text(json.dumps({"weight_version": int(version)}))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return str(out)


def read_version(path: str | Path) -> int | None:
    """The weight version recorded beside the weights, or None."""
    file = Path(path) / VERSION_FILE
    try:
        value = json.loads(file.read_text()).get("weight_version")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the safetensors weights in directory ``path`` into ``model`` in place.

    Every tensor is checked against the model before anything is copied, so a
    directory that does not fit leaves the model as it was.

    Raises:
        WeightsLoadError: no such directory, no safetensors in it, or names or
            shapes that do not fit ``model``.
    """
    from safetensors.torch import load_file

    folder = Path(path)
    if not folder.is_dir():
        raise WeightsLoadError(f"{str(folder)!r} is not a directory this server can read")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsLoadError(f"{str(folder)!r} holds no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape))
    tied = {"lm_head.weight"} if getattr(getattr(model, "config", None), "tie_word_embeddings", False) else set()
    missing = sorted(set(own) - set(state) - tied)
    if unexpected or wrong or missing:
        parts = []
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} tensors of another shape (e.g. {k}: {tuple(state[k].shape)} on disk, "
                f"{tuple(own[k].shape)} served)"
            )
        if missing:
            parts.append(f"{len(missing)} tensors missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unknown tensors (e.g. {unexpected[0]})")
        raise WeightsLoadError(
            f"the weights in {str(folder)!r} do not fit the served model: {'; '.join(parts)}"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor.to(dtype=own[name].dtype))

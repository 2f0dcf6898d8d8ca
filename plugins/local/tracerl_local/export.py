"""A Hugging Face model directory from the local backend's model (``python -m core.export``).

``export_model`` writes what ``transformers.AutoModelForCausalLM.from_pretrained``,
vLLM (``vllm serve DIR``) and SGLang (``python -m sglang.launch_server --model-path DIR``)
load: ``config.json``, ``model.safetensors``, ``generation_config.json`` (its
``eos_token_id`` lists every end-of-turn id the gateway stopped on, so an engine stops
where training did), the tokenizer with its chat template, and ``tracerl_export.json``
(where it came from; engines ignore it).

The tokenizer directory is checked with ``transformers.AutoTokenizer``: a tokenizer of the
generic fast class in a model type whose own class transformers forces (the offline ``tiny``
preset: its own byte-level BPE in a Qwen2 architecture) gets an ``auto_map`` that makes
``AutoTokenizer`` load ``tokenizer.json`` as it is (see ``_save_tokenizer``).

With LoRA the adapters are merged into a copy of the weights by default; ``adapter=True``
writes the peft adapter instead (``adapter_config.json`` + ``adapter_model.safetensors``),
whose ``base_model_name_or_path`` is ``backend.model``, or for the offline ``tiny``
preset the base weights written beside it in ``base/``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError
from core.tokenizer import end_of_turn_ids

log = logging.getLogger(__name__)

__all__ = ["EXPORT_FILE", "TOKENIZER_MODULE", "export_model"]

EXPORT_FILE = "tracerl_export.json"
TOKENIZER_MODULE = "tokenization_tracerl.py"
"""Written beside a generic tokenizer whose model type would load another class (``_save_tokenizer``)."""
_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")
_MODULE_TEXT = '''"""The tokenizer of a model exported by tracerl (``python -m core.export``).

``tokenizer.json`` here is loaded as it is: transformers' class for this model type would
rebuild its own pre-tokenizer and give other token ids. ``AutoTokenizer`` reaches this class
through ``auto_map`` only with ``trust_remote_code=True``; without it, it loads the same
generic class (``tokenizer_class``).
"""

from transformers import PreTrainedTokenizerFast


class TracerlTokenizer(PreTrainedTokenizerFast):
    """transformers' generic fast tokenizer, under a name ``auto_map`` can point at."""
'''


def _generation_config(model: Any, tokenizer: Any) -> Any:
    """The model's generation config, its ``eos_token_id`` every id that ends a turn."""
    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None)
    gen = copy.deepcopy(base) if base is not None else GenerationConfig()
    eos = list(end_of_turn_ids(tokenizer, generation_config=base))
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    gen.pad_token_id = tokenizer.pad_token_id
    if getattr(tokenizer, "bos_token_id", None) is not None:
        gen.bos_token_id = tokenizer.bos_token_id
    return gen


def _auto_difference(tokenizer: Any, out: Path) -> str | None:
    """The first probe on which ``AutoTokenizer.from_pretrained(out)`` differs from
    ``tokenizer``, or why it could not load the directory (a tokenizer of remote code, say)."""
    from transformers import AutoTokenizer

    from core.tokenizer_export import fingerprint, first_difference

    try:
        loaded = AutoTokenizer.from_pretrained(str(out))
    except Exception as exc:  # the export stands; the warning says how it loads
        return f"AutoTokenizer cannot load it: {type(exc).__name__}: {exc}"
    return first_difference(fingerprint(tokenizer), fingerprint(loaded))


def _save_tokenizer(tokenizer: Any, out: Path) -> None:
    """Save ``tokenizer`` to ``out`` so that ``AutoTokenizer.from_pretrained(out)`` loads the same one.

    Why: transformers 5 loads a qwen2 directory (and other types it lists as declaring wrong
    classes) with the type's own tokenizer class whatever ``tokenizer_class`` says, and that
    class rebuilds its pre-tokenizer; a generic tokenizer there (the tiny preset's) would then
    split digits apart and give other ids. An ``auto_map`` entry is the one thing
    ``AutoTokenizer`` follows before that rule (to the generic class without
    ``trust_remote_code``, to ``TOKENIZER_MODULE``'s subclass of it with).
    """
    tokenizer.save_pretrained(str(out))
    difference = _auto_difference(tokenizer, out)
    if difference is None:
        return
    if type(tokenizer).__name__ in _GENERIC_TOKENIZERS:
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config["auto_map"] = {"AutoTokenizer": [None, f"{TOKENIZER_MODULE[:-3]}.TracerlTokenizer"]}
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        (out / TOKENIZER_MODULE).write_text(_MODULE_TEXT)
        difference = _auto_difference(tokenizer, out)
    if difference is not None:
        log.warning(
            "AutoTokenizer.from_pretrained(%r) does not give the trained tokenizer (%s): load it "
            "with transformers.%s.from_pretrained", str(out), difference, type(tokenizer).__name__,
        )


def _write_full(model: Any, tokenizer: Any, out: Path) -> None:
    model.save_pretrained(str(out), safe_serialization=True)
    _save_tokenizer(tokenizer, out)
    _generation_config(model, tokenizer).save_pretrained(str(out))


def _readable(root: Path) -> None:
    """Give every file the mode the umask allows (safetensors writes 0600): a server
    running as another user reads the directory."""
    umask = os.umask(0)
    os.umask(umask)
    for file in root.rglob("*"):
        if file.is_file():
            file.chmod(0o666 & ~umask)


def export_model(model: Any, tokenizer: Any, path: str | Path, *, adapter: bool, info: dict[str, Any]) -> str:
    """Write ``model`` (a transformers model, maybe a peft one) and ``tokenizer`` to directory ``path``.

    Args:
        model: The trained model; left as it is (merging works on a copy).
        tokenizer: Its tokenizer (the chat template is saved with it).
        path: A new or empty directory.
        adapter: With LoRA, write the adapter instead of merged weights.
        info: Written to ``tracerl_export.json`` (``base_model``, checkpoint, step, ...).

    Returns:
        The directory's absolute path.

    Raises:
        ConfigError: ``path`` holds files, or ``adapter`` without LoRA.
    """
    out = Path(path).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{str(out)!r} exists and is not an empty directory; pass a new OUT_DIR")
    is_peft = callable(getattr(model, "merge_and_unload", None))
    if adapter and not is_peft:
        raise ConfigError(
            "--adapter writes LoRA adapters, but this run trained the full model "
            "(backend.lora.enabled=false); export without --adapter"
        )
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    base_model = str(info.get("base_model", ""))
    with torch.no_grad():
        if adapter:
            peft_config = model.peft_config["default"]
            saved_base = peft_config.base_model_name_or_path
            if base_model == "tiny":  # no name an engine could load: write the base beside it
                _write_full(copy.deepcopy(model).unload(), tokenizer, tmp / "base")
                peft_config.base_model_name_or_path = str(out / "base")
            else:  # a Hub name as given; a local directory as an absolute path (cwd-proof)
                local = Path(base_model)
                peft_config.base_model_name_or_path = str(local.resolve()) if local.is_dir() else base_model
            try:
                model.save_pretrained(str(tmp), save_embedding_layers=False)  # no Hub lookup of the base
            finally:
                peft_config.base_model_name_or_path = saved_base
            _save_tokenizer(tokenizer, tmp)
        else:
            plain = copy.deepcopy(model).merge_and_unload() if is_peft else model
            _write_full(plain, tokenizer, tmp)
    record = {**info, "format": "peft_adapter" if adapter else "merged" if is_peft else "full"}
    (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    _readable(tmp)
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return str(out)

"""Tokenizers: loading a model's tokenizer, and building a tiny one offline.

Defines:

- ``CHATML_TOOLS_TEMPLATE``: a Qwen3-style ChatML chat template with tool
  support (``<tool_call>`` JSON blocks, ``<tool_response>`` turns), so the
  gateway's Hermes/Qwen3 tool parser works on tiny models too.
- ``build_tiny_tokenizer``: a small byte-level BPE trained offline and
  deterministically with the ``tokenizers`` library, wrapped as a
  ``PreTrainedTokenizerFast`` carrying that template. Nothing is downloaded.
- ``load_tokenizer``: ``"tiny"`` or a Hugging Face name/path.
- ``with_chat_template``: a Mistral tokenizer loaded in Mistral's own format
  (transformers' ``MistralCommonBackend``, which has no Jinja template) as
  transformers' converted fast tokenizer with a chat template the gateway renders.
- ``end_of_turn_ids``: every token id that ends the model's turn (EOS, the
  ``generation_config.json`` ``eos_token_id`` list, the chat template's
  end-of-turn token), the one place samplers and the gateway take stop ids from.

transformers and tokenizers are imported inside the functions so that
``import core`` stays light.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen3-style: the same shape as Qwen3's template (system + "# Tools" block,
# <tool_call> JSON per call, tool results as <tool_response> in a user turn),
# without the reasoning-content handling a tiny model never needs.
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_ASCII = "".join(chr(c) for c in range(32, 127)) + "\n\t"


def default_corpus() -> list[str]:
    """Rendered chats a tiny tokenizer is trained on: digits, short phrases, tool calls.

    Every printable ASCII character appears, so any ASCII text encodes even
    without a full byte alphabet; merges favour the chat scaffolding so
    prompts stay short (about 20 tokens for a toy question).
    """
    texts = [_ASCII]
    for n in range(10):
        texts.append(
            f"{IM_START}system\nSay the next digit.{IM_END}\n"
            f"{IM_START}user\nAfter {n}?{IM_END}\n{IM_START}assistant\n{(n + 1) % 10}{IM_END}\n"
        )
        texts.append(
            f"{IM_START}user\nCopy: {n}{IM_END}\n{IM_START}assistant\n{n}{IM_END}\n"
        )
    call = {"name": "calculator", "arguments": {"expression": "12 * 7"}}
    texts.append(
        f"{IM_START}assistant\n<tool_call>\n{json.dumps(call)}\n</tool_call>{IM_END}\n"
        f"{IM_START}user\n<tool_response>\n84\n</tool_response>{IM_END}\n"
        f"{IM_START}assistant\nThe answer is #### 84{IM_END}\n"
    )
    return texts


def build_tiny_tokenizer(
    corpus: list[str] | None = None,
    *,
    vocab_size: int = 160,
    full_byte_alphabet: bool = False,
    chat_template: str = CHATML_TOOLS_TEMPLATE,
    whole_tokens: Sequence[str] = (),
) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE offline; same corpus, same tokenizer.

    Args:
        corpus: Training texts; ``default_corpus()`` when None.
        vocab_size: Target vocabulary size including the 3 special tokens.
        full_byte_alphabet: Start from all 256 bytes, so any text round-trips
            (the vocabulary then holds at least 259 entries). Off by default:
            a small vocabulary is what lets a tiny model learn in seconds.
        chat_template: Jinja chat template; Qwen3-style ChatML with tools by default.
        whole_tokens: Strings each kept as one token (added tokens, never split,
            left out of the BPE training): a task's fixed texts, such as the
            tools block its chats always carry or a whole tool call, so a
            random-init policy sees short prompts and can emit a call by chance.
            Real tokenizers do the same for ``<tool_call>`` (Qwen's added tokens).

    Returns:
        A ``PreTrainedTokenizerFast`` with ``<|im_end|>`` as EOS and
        ``<|endoftext|>`` as padding.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = default_corpus() if corpus is None else list(corpus)
    whole = list(dict.fromkeys(t for t in whole_tokens if t))
    if whole:  # the BPE learns only the text around them
        cut = re.compile("|".join(re.escape(t) for t in sorted(whole, key=len, reverse=True)))
        texts = [piece for text in texts for piece in cut.split(text) if piece]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if full_byte_alphabet else [],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
    )
    if whole:
        wrapped.add_tokens([AddedToken(t, normalized=False, special=False) for t in whole])
    wrapped.chat_template = chat_template
    return wrapped


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """``"tiny"`` builds the offline tokenizer; anything else goes to ``AutoTokenizer``.

    ``AutoTokenizer`` imports torch when it is installed (transformers 5); a
    process that needs no model (``python -m core.gateway`` in front of an
    inference server) uses ``core.tokenizer_export.load_tokenizer_without_torch``.
    """
    if name_or_path == "tiny":
        return build_tiny_tokenizer(**kwargs)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if _is_mistral_common(tokenizer) and _tekken_file(tokenizer) is None:
        # A SentencePiece Mistral tokenizer (v1-v7 files): its Hugging Face files carry the template.
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **{**kwargs, "mistral_format": False})
    return with_chat_template(tokenizer)


def _is_mistral_common(tokenizer: Any) -> bool:
    return type(tokenizer).__name__ == "MistralCommonBackend"


def _tekken_file(tokenizer: Any) -> Path | None:
    """The ``tekken.json`` a Mistral tokenizer was loaded or converted from, if it still exists."""
    for raw in (getattr(tokenizer, "_tokenizer_path", None), (getattr(tokenizer, "init_kwargs", None) or {}).get("vocab_file")):
        if raw is None:
            continue
        path = Path(str(raw))
        if path.suffix == ".json" and "tekken" in path.name and path.is_file():
            return path
    return None


def with_chat_template(tokenizer: Any) -> Any:
    """``tokenizer``, or for a Tekken-based Mistral tokenizer without a chat template its
    Hugging Face conversion with one; other tokenizers come back unchanged.

    Why: with ``mistral-common`` installed, transformers 5 loads Mistral checkpoints that ship a
    ``tekken.json`` as ``MistralCommonBackend``, which encodes chats with mistral-common and has
    no Jinja chat template, the gateway's renderer. transformers' own ``convert_tekken_tokenizer``
    (what its ``save_pretrained(save_format="hf")`` uses) gives the same token ids as a fast
    tokenizer, with the checkpoint's ``chat_template.jinja`` beside the file, else the template
    mistral-common generates for that tokenizer (``tests/gateway/test_families.py`` checks it
    against mistral-common's own encoding). Needs ``mistral-common`` (``tracerl[mistral]``).
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer
    path = _tekken_file(tokenizer)
    if path is None:
        return tokenizer
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    converted = convert_tekken_tokenizer(str(path))
    # The conversion forgets where the checkpoint is (so may the loaded tokenizer: then the
    # tekken.json's directory); end_of_turn_ids reads its generation_config.json from there.
    converted.name_or_path = getattr(tokenizer, "name_or_path", "") or str(path.parent)
    return converted


_EOT_USER = "\u2063tracerl-eot-user\u2063"
_EOT_ASSISTANT = "\u2063tracerl-eot-assistant\u2063"


def _eos_list(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _generation_config_eos(tokenizer: Any) -> list[int]:
    """``eos_token_id`` of the ``generation_config.json`` next to the tokenizer's files.

    Read from the tokenizer's directory, or from the Hugging Face cache when it
    was loaded by name; never downloaded.
    """
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if not name:
        return []
    path: Path | None = Path(name) / "generation_config.json"
    if path is not None and not path.is_file():
        path = None
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(name, "generation_config.json")
            path = Path(hit) if isinstance(hit, str) else None
        except Exception:  # not a repo id, or no hub library: no cached config
            path = None
    if path is None:
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return _eos_list(data.get("eos_token_id")) if isinstance(data, dict) else []


def _special_ids(tokenizer: Any) -> set[int]:
    ids = {i for i in getattr(tokenizer, "all_special_ids", ()) or () if isinstance(i, int)}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for i, added in dict(decoder).items():
        if getattr(added, "special", False):
            ids.add(int(i))
    return ids


def _template_end_of_turn(tokenizer: Any) -> list[int]:
    """The first special token the chat template writes after an assistant message."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    chat = [{"role": "user", "content": _EOT_USER}, {"role": "assistant", "content": _EOT_ASSISTANT}]
    try:
        text = str(tokenizer.apply_chat_template(chat, tokenize=False))
    except Exception:  # a template that cannot render this toy chat: nothing to learn from it
        return []
    cut = text.rfind(_EOT_ASSISTANT)
    if cut < 0:
        return []
    closer = text[cut + len(_EOT_ASSISTANT) :]
    if not closer:
        return []
    specials = _special_ids(tokenizer)
    ids = list(tokenizer.encode(closer, add_special_tokens=False))
    return [next(i for i in ids if i in specials)] if any(i in specials for i in ids) else []


def end_of_turn_ids(tokenizer: Any, *, generation_config: Any = None) -> tuple[int, ...]:
    """Every token id that ends the model's turn, EOS first, without repeats.

    Why: many models end a chat turn with a token other than EOS (Llama 3's
    ``<|eot_id|>``, Gemma's ``<end_of_turn>``) or list several ``eos_token_id``
    in ``generation_config.json``; a sampler that stops on EOS alone generates
    past the turn and invents the next ones. Sources:

    - ``tokenizer.eos_token_id``;
    - ``generation_config``'s ``eos_token_id`` (an int or a list; a
      ``GenerationConfig``, a model config or a dict), or when None the
      ``generation_config.json`` beside the tokenizer's files (its directory or
      the Hugging Face cache; never downloaded);
    - the first special token the chat template writes after an assistant
      message (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``).
    """
    ids: list[int] = _eos_list(getattr(tokenizer, "eos_token_id", None))
    if generation_config is None:
        ids += _generation_config_eos(tokenizer)
    else:
        value = (
            generation_config.get("eos_token_id")
            if isinstance(generation_config, dict)
            else getattr(generation_config, "eos_token_id", None)
        )
        ids += _eos_list(value)
    ids += _template_end_of_turn(tokenizer)
    return tuple(dict.fromkeys(i for i in ids if i >= 0))

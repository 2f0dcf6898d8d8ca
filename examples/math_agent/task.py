"""What ``task=math_agent`` needs beyond the agent: the data files and a tiny tokenizer's corpus.

The data set ships with the repository (``examples/math_agent/data/``, 32
training and 4 eval questions, JSONL: ``{"payload": {"prompt": ..., "answer": ...}}``
per line). ``tokenizer_corpus`` serves only the offline ``tiny`` model: like the
embedded task's, its tokenizer is trained on this task's own rendered chats
(system prompt, calculator schema, the questions, a tool call and its result),
so the agent's unchanged prompt takes about 240 tokens instead of 740 with the
generic corpus. A Hugging Face model ignores it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
TRAIN_PATH = DATA / "train.jsonl"
EVAL_PATH = DATA / "eval.jsonl"

_ASCII = "".join(chr(c) for c in range(32, 127)) + "\n\t"


def _payloads(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line)["payload"] for line in path.read_text().splitlines() if line.strip()]


def tokenizer_corpus() -> list[str]:
    """The task's chats rendered with the tiny model's template (every printable ASCII
    character included, so any question still encodes)."""
    from core.tokenizer import build_tiny_tokenizer
    from examples.math_agent.agent import SYSTEM_PROMPT
    from examples.math_agent.calculator import CALCULATOR_TOOL

    renderer = build_tiny_tokenizer()  # only its chat template is used here
    texts = [_ASCII]
    for payload in _payloads(TRAIN_PATH) + _payloads(EVAL_PATH):
        call = {"name": "calculator", "arguments": {"expression": "12 * 7"}}
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": payload["prompt"]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": "84"},
            {"role": "assistant", "content": f"Step by step.\n#### {payload['answer']}"},
        ]
        texts.append(
            str(renderer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False))
        )
    return texts

"""A multi-turn, tool-using toy task: "Key a?" -> call ``lookup(key)`` -> answer its value.

Each row holds a table of random digits (one per key of ``KEYS``) and asks for
a key. The value is drawn per row, so nothing in the prompt predicts it: the
only way to the answer is a ``lookup`` call, whose result the agent sends back
as a tool message before the model answers. It proves multi-turn credit
assignment on the real stack: the model writes the chat template's
``<tool_call>`` text, the gateway's Hermes parser turns it into ``tool_calls``,
and the trace's second turn is trained with the tool result masked out.

Shrunk for a random-init 137k-parameter model on CPU: one key (so the call
takes no choice), values from the first ``digits`` digits (4 in the task
config), the value repeated ``REPEAT`` times in the tool result, and (in
recipe/lookup-local.yaml) one token per turn: the call is one token and the
answer one digit. Measured (docs/quickstart.md): every run (seeds 0-4) calls
the tool and answers the looked-up value in most rollouts by step 150.

Reward (shaped, stated in full; at most 1.0):

- no well-formed ``lookup`` call in the rollout: 0.0, whatever the answer
  (nothing for guessing). This is the no-tool baseline: the best a policy
  that never calls the tool can score.
- no answer (the second turn called the tool again): 0.0.
- a well-formed call (any key) followed by an answer: ``CALL_CREDIT`` (0.2),
  shaped: it gives a random policy a signal for the call alone;
- the asked key looked up: plus the remaining 0.8 times the answer's
  character-wise credit against its value (``succ_digit.charwise_reward``:
  right digit and stop = 1, right digit then k junk characters = 1/(k+1)).

A policy that calls the tool and answers a digit without reading the result
scores 0.2 plus 0.8 for a right answer by chance (1 in 4 with 4 digits: 0.4
on average); only reading the result reaches 1.0. There is no credit for an
answer's form (a digit, any digit): measured, it pulled every group towards
the same digit whatever the value (0.1 for it in every group, the value's
0.7 in a quarter of them), and one run of two settled on a constant answer
that no group then told apart (docs/quickstart.md).

Learnable from random initialisation because the task's tokenizer keeps its
fixed texts whole (``tokenizer_tokens``): the tools block the template writes
into every system prompt and each of the ``len(KEYS)`` possible calls are one
token each, so a prompt is 23 tokens and a random policy emits a call by
chance (one of the vocabulary's 79 tokens is the call; recipe/lookup-local.yaml
caps a turn at 1 token, so a call is the turn's last token, which the parser
needs). Real tokenizers do the same for ``<tool_call>`` (Qwen's added
tokens); a call spelled out in some 25 tokens would not be found by a random
policy in minutes.

The agent is ordinary production-style code on the official ``openai`` SDK,
one ``AsyncOpenAI`` per process (an SDK client per call costs about 32 ms).
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.agent import AgentApp, ModelConfig
from core.tasks.succ_digit import charwise_reward

if TYPE_CHECKING:
    from openai import AsyncOpenAI

SYSTEM = "Look up the key."
KEYS = ("a",)
"""Keys of every row's table (the model must look up the one asked for); one, so
the call is a single token to find (more keys are a choice to learn on top)."""
CALL_CREDIT = 0.2
"""Reward for a well-formed ``lookup`` call followed by an answer (shaped)."""
REPEAT = 8
"""The tool answers with the value written this many times ("7" -> "77777777"): at
random initialisation attention is near uniform, so eight copies of the value in
the context (and tied embeddings) make the policy more likely to say it. With a
single copy, runs here had collapsed to a constant answer by step 150; with 32 copies
(a longer context; 3 tokens a turn) two runs of two had not found a digit answer by step 150."""
MAX_TURNS = 2
"""Model turns per rollout: the call, then the answer (a second call leaves no answer)."""
FORWARDED = ("temperature", "top_p", "max_tokens")
"""Sampling settings the agent forwards from its payload's config."""

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Value of a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}


def question(key: str) -> str:
    return f"Key {key}?"


def call_text(key: str) -> str:
    """The tool call as the chat template writes it (and the model must emit it)."""
    return "<tool_call>\n" + json.dumps({"name": "lookup", "arguments": {"key": key}}) + "\n</tool_call>"


def lookup_reward(
    called: list[str], asked: str, table: dict[str, str], answer: str | None
) -> float:
    """The reward of the module docstring: ``called`` lists the keys looked up, in order;
    ``answer`` is None when every turn called the tool (the agent never answered)."""
    if not called or answer is None:
        return 0.0
    reward = CALL_CREDIT
    if asked in called:
        reward += (1.0 - CALL_CREDIT) * charwise_reward(answer, table[asked])
    return reward


def _chat(key: str, value: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question(key)},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "lookup", "arguments": {"key": key}}}
            ],
        },
        {"role": "tool", "content": value},
        {"role": "assistant", "content": value},
    ]


@functools.cache
def _template_tokenizer() -> Any:
    from core.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()  # any tokenizer with the template renders the same text


def _render(messages: list[dict[str, Any]]) -> str:
    """The chat as the gateway renders it for the tiny model (same template, same tools)."""
    return str(_template_tokenizer().apply_chat_template(messages, tools=[LOOKUP_TOOL], tokenize=False))


def tools_block() -> str:
    """The fixed text the template adds to the system prompt for ``LOOKUP_TOOL``."""
    text = _render([{"role": "system", "content": SYSTEM}])
    head = f"system\n{SYSTEM}\n\n"
    start = text.index(head) + len(head)
    return text[start : text.index("<|im_end|>", start)]


def tokenizer_tokens() -> list[str]:
    """Texts the task's tokenizer keeps whole: the tools block, every possible call,
    and the tool-result tags (added tokens in Qwen's tokenizer too)."""
    return [tools_block(), *(call_text(k) for k in KEYS), "<tool_response>", "</tool_response>"]


def tokenizer_corpus() -> list[str]:
    """The task's rendered chats (every key, every value), for a tokenizer built from scratch."""
    return [_render(_chat(k, str(v))) for k in KEYS for v in range(10)] * 10


def write_dataset(
    train_path: str, eval_path: str, *, rows: int = 1000, digits: int = 10, seed: int = 0
) -> None:
    """Write ``rows`` random training payloads and 8 eval payloads.

    Payload: ``{"key": asked key, "table": {key: digit string}}``, each value drawn
    per row from the first ``digits`` digits (fewer: an easier copy).
    """
    if not 1 <= digits <= 10:
        raise ValueError(f"task.generator_kwargs.digits must be 1..10, got {digits}")
    rng = random.Random(seed)

    def row() -> dict[str, Any]:
        table = {k: str(rng.randrange(digits)) for k in KEYS}
        return {"payload": {"key": rng.choice(KEYS), "table": table}}

    Path(train_path).parent.mkdir(parents=True, exist_ok=True)
    with open(train_path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps(row()) + "\n")
    with open(eval_path, "w") as f:
        for i in range(8):
            r = row()
            r["payload"]["key"] = KEYS[i % len(KEYS)]
            f.write(json.dumps(r) + "\n")


app = AgentApp()
_clients: dict[str, AsyncOpenAI] = {}


def _client(base_url: str) -> AsyncOpenAI:
    """One SDK client (one connection pool) per gateway URL for the whole process."""
    client = _clients.get(base_url)
    if client is None:
        from openai import AsyncOpenAI, DefaultAioHttpClient

        try:  # the SDK's aiohttp transport: 1.4 ms of CPU per call here against 3.4 ms for httpx
            http_client: Any = DefaultAioHttpClient(timeout=60.0)
        except RuntimeError:  # an openai without its aiohttp extra: the default transport
            http_client = None
        client = AsyncOpenAI(
            base_url=base_url, api_key="per-request", max_retries=0, timeout=60.0, http_client=http_client
        )
        _clients[base_url] = client
    return client


def _parse_payload(payload: dict[str, Any]) -> tuple[str, dict[str, str]]:
    key, table = payload.get("key"), payload.get("table")
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ValueError(f"payload 'table' must map keys to strings, got {table!r}")
    if not isinstance(key, str) or key not in table:
        raise ValueError(f"payload 'key' must be one of the table's keys {sorted(table)}, got {key!r}")
    return key, {str(k): v for k, v in table.items()}


@app.entrypoint
async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Offer ``lookup``, run its calls, and score the first reply that calls nothing."""
    asked, table = _parse_payload(payload)
    cfg = ModelConfig.from_payload(payload)
    sampling = {k: v for k, v in cfg.sampling_params.items() if k in FORWARDED}
    # The api key names the gateway session, so it changes per rollout; the pool does not.
    client = _client(cfg.base_url).with_options(api_key=cfg.api_key)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question(asked)},
    ]
    called: list[str] = []
    answer: str | None = None
    turns = 0
    for _ in range(MAX_TURNS):
        turns += 1
        completion = await client.chat.completions.create(
            model=cfg.model_id,
            messages=messages,  # type: ignore[arg-type]
            tools=[LOOKUP_TOOL],  # type: ignore[list-item]
            parallel_tool_calls=False,  # one lookup per turn: the gateway returns the first call
            **sampling,
        )
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = message.content or ""
            break
        for call in message.tool_calls:
            key = ""
            if call.type == "function" and call.function.name == "lookup":
                try:
                    key = str(json.loads(call.function.arguments).get("key", ""))
                except (ValueError, AttributeError):
                    key = ""
            if key:
                called.append(key)
            output = table[key] * REPEAT if key in table else "?"  # "?": characters the tokenizer has
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return {
        "reward": lookup_reward(called, asked, table, answer),
        "metrics": {
            "turns": float(turns),
            "tool_calls": float(len(called)),
            "looked_up_asked": float(asked in called),
            # The answer has the right form (a digit first).
            "answer_is_digit": float(answer is not None and answer.strip()[:1].isdigit()),
            # The answer starts with the looked-up value: 1 in `digits` by chance.
            "answer_starts_right": float(
                asked in called and answer is not None and answer.strip()[:1] == table[asked]
            ),
        },
    }

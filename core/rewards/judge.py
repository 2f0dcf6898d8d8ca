"""``reward=judge``: an LLM judge behind any OpenAI-compatible endpoint.

With ``relative: true`` (the default, RULER-style) one request shows the judge
every trajectory of a group and asks for a score in [0, 1] for each, relative
to the others; with ``relative: false`` each trajectory is scored alone. The
reply must hold JSON ``{"scores": [{"id": "t1", "score": 0.8}, ...]}``.
A failed request or an unusable reply is retried (``max_retries``, with
backoff); when every try fails, the group's rollouts become ``judge_error``.
Requests run at most ``concurrency`` at once; identical requests are answered
from a cache (in memory, and in ``cache_path`` when set, which survives runs).
The cache holds the ``cache_size`` most recently used replies: a long run asks
the judge about ever new groups, and an unbounded cache would grow with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.rewards.base import RewardConfig, RewardInput, RewardOutput, transcript

__all__ = ["JudgeError", "JudgeReward", "JudgeRewardConfig"]

DEFAULT_RUBRIC = (
    "Score how well each trajectory accomplishes the task: a correct, complete answer "
    "scores near 1, a wrong or missing one near 0."
)

DEFAULT_CACHE_SIZE = 10_000
"""Replies the judge cache keeps by default: a group's reply is a few scores, so
about a few MB at most, while repeats (resumed steps, the same eval set each
evaluation) come within far fewer requests than this."""


@dataclass
class JudgeRewardConfig(RewardConfig):
    """``reward=judge`` settings."""

    name: str = "judge"
    endpoint: str = ""
    """OpenAI-compatible base URL of the judge model (``.../v1``)."""
    model: str = ""
    """Judge model name."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable with the judge's API key (unset: ``EMPTY``)."""
    rubric: str = DEFAULT_RUBRIC
    """What a good trajectory is, in words the judge reads."""
    relative: bool = True
    """Score a group's trajectories together, relative to each other (RULER); false: one by one."""
    max_retries: int = 3
    """Tries after the first failed request or unusable reply."""
    retry_backoff_s: float = 0.5
    """First pause between tries (doubled each time)."""
    concurrency: int = 8
    """Most judge requests in flight."""
    request_timeout_s: float = 120.0
    """Deadline of one judge request."""
    temperature: float = 0.0
    """Judge sampling temperature."""
    max_tokens: int = 1024
    """Most tokens of the judge's reply."""
    cache_path: str = ""
    """JSONL file caching replies across runs; empty: in memory only."""
    cache_size: int = DEFAULT_CACHE_SIZE
    """Most replies kept (least recently used dropped first); 0 caches nothing."""


class JudgeError(Exception):
    """A judge reply that cannot be used (retried, then reported as ``judge_error``)."""


class JudgeReward:
    """Scores rollouts through a judge model; see the module docstring."""

    def __init__(self, config: Any) -> None:
        if not config.endpoint or not config.model:
            raise ConfigError(
                "reward=judge needs reward.endpoint (an OpenAI-compatible base URL) and reward.model"
            )
        if int(config.max_retries) < 0 or int(config.concurrency) < 1:
            raise ConfigError("reward.max_retries must be >= 0 and reward.concurrency >= 1")
        size = config.cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(
                f"reward.cache_size must be an integer >= 0 (replies kept; 0: no cache), got {size!r}"
            )
        self.cfg = config
        self.url = str(config.endpoint).rstrip("/") + "/chat/completions"
        self.api_key = os.environ.get(str(config.api_key_env), "") or "EMPTY"
        self._sem = asyncio.Semaphore(int(config.concurrency))
        self.cache_size = size
        self._cache: OrderedDict[str, dict[str, float]] = OrderedDict()
        self._cache_file = Path(str(config.cache_path)) if config.cache_path else None
        if self._cache_file is not None and self._cache_file.exists():
            self._load_cache_file(self._cache_file)
        self._client: Any = None
        self.requests = 0
        """Requests sent (cache hits are not)."""

    def _remember(self, key: str, scores: dict[str, float]) -> None:
        """Cache ``scores`` as the newest entry, dropping the least recently used past ``cache_size``."""
        if self.cache_size == 0:
            return
        self._cache[key] = scores
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _load_cache_file(self, path: Path) -> None:
        """Read the newest ``cache_size`` replies of ``path``; rewrite it when it holds
        more than twice that (its lines are only ever appended, so it would grow
        without end across runs)."""
        lines = path.read_text().splitlines()
        for line in lines:
            try:
                entry = json.loads(line)
                self._remember(str(entry["key"]), {str(k): float(v) for k, v in entry["scores"].items()})
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a torn line: that request is asked again
        if self.cache_size and len(lines) > 2 * self.cache_size:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(json.dumps({"key": k, "scores": v}) + "\n" for k, v in self._cache.items()))
            os.replace(tmp, path)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def score(self, group: Sequence[RewardInput]) -> list[RewardOutput]:
        if bool(self.cfg.relative):
            scores = await self._judge(group)
            return [RewardOutput(reward=s) for s in scores]
        results = await asyncio.gather(*(self._judge([item]) for item in group), return_exceptions=True)
        return [
            RewardOutput(error=f"{type(r).__name__}: {r}") if isinstance(r, BaseException) else RewardOutput(reward=r[0])
            for r in results
        ]

    def _messages(self, group: Sequence[RewardInput]) -> list[dict[str, str]]:
        task = json.dumps({k: v for k, v in group[0].payload.items() if not str(k).startswith("_")}, default=str)
        ids = [f"t{i + 1}" for i in range(len(group))]
        how = (
            "Compare the trajectories with each other and give each a score from 0 to 1; better "
            "trajectories get higher scores."
            if len(group) > 1
            else "Give the trajectory a score from 0 to 1."
        )
        system = (
            f"You are a strict judge of an AI agent's work.\nRubric: {self.cfg.rubric}\n{how}\n"
            'Reply with JSON only: {"scores": [{"id": "<id>", "score": <number 0..1>, "why": "<short>"}]} '
            f"with one entry for each of {', '.join(ids)}."
        )
        body = [f"Task: {task}"]
        for tid, item in zip(ids, group, strict=True):
            body.append(f'<trajectory id="{tid}">\n{transcript(item.conversation)}\n</trajectory>')
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(body)}]

    async def _judge(self, group: Sequence[RewardInput]) -> list[float]:
        messages = self._messages(group)
        request = {
            "model": str(self.cfg.model),
            "messages": messages,
            "temperature": float(self.cfg.temperature),
            "max_tokens": int(self.cfg.max_tokens),
        }
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        ids = [f"t{i + 1}" for i in range(len(group))]
        cached = self._cache.get(key)
        if cached is not None and all(i in cached for i in ids):
            self._cache.move_to_end(key)
            return [cached[i] for i in ids]
        delay = float(self.cfg.retry_backoff_s)
        errors: list[str] = []
        for attempt in range(int(self.cfg.max_retries) + 1):
            try:
                scores = await self._ask(request, ids)
                break
            except Exception as exc:  # HTTP, connection, timeout or an unusable reply: try again
                what = str(exc) if isinstance(exc, JudgeError) else f"{type(exc).__name__}: {exc}"
                errors.append(f"try {attempt + 1}: {what}")
                if attempt == int(self.cfg.max_retries):
                    raise JudgeError(
                        f"the judge at {self.url} failed {attempt + 1} times: {'; '.join(errors)[-1500:]}"
                    ) from None
                await asyncio.sleep(delay)
                delay *= 2
        self._remember(key, scores)
        if self._cache_file is not None and self.cache_size > 0:
            self._cache_file.parent.mkdir(parents=True, exist_ok=True)
            with self._cache_file.open("a") as f:
                f.write(json.dumps({"key": key, "scores": scores}) + "\n")
        return [scores[i] for i in ids]

    async def _ask(self, request: dict[str, Any], ids: list[str]) -> dict[str, float]:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=float(self.cfg.request_timeout_s))
        async with self._sem:
            self.requests += 1
            response = await self._client.post(
                self.url, json=request, headers={"Authorization": f"Bearer {self.api_key}"}
            )
        if response.status_code != 200:
            raise JudgeError(f"HTTP {response.status_code}: {response.text[:300]}")
        try:
            content = response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"not a chat completion: {response.text[:300]}") from exc
        return parse_scores(content, ids)


def parse_scores(content: str, ids: list[str]) -> dict[str, float]:
    """The ``{"scores": [...]}`` JSON in a judge's reply, one finite score in [0, 1] per id."""
    start, end = content.find("{"), content.rfind("}")
    if start < 0 or end < start:
        raise JudgeError(f"no JSON object in the judge's reply: {content[:200]!r}")
    try:
        data = json.loads(content[start : end + 1])
    except json.JSONDecodeError as exc:
        raise JudgeError(f"the judge's JSON does not parse ({exc.msg}): {content[:200]!r}") from None
    raw = data.get("scores") if isinstance(data, dict) else None
    if isinstance(raw, dict):
        raw = [{"id": k, "score": v} for k, v in raw.items()]
    if not isinstance(raw, list):
        raise JudgeError(f"the judge's JSON has no 'scores' list: {content[:200]!r}")
    out: dict[str, float] = {}
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        value = entry.get("score")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise JudgeError(f"score {value!r} of {entry.get('id')!r} is not a finite number")
        if not 0.0 <= float(value) <= 1.0:
            raise JudgeError(f"score {value!r} of {entry.get('id')!r} is outside [0, 1]")
        out[str(entry.get("id"))] = float(value)
    missing = [i for i in ids if i not in out]
    if missing:
        raise JudgeError(f"the judge gave no score for {missing} (got {sorted(out)})")
    return out

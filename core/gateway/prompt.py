"""Building a turn's prompt: the request matched against the session's tree, then rendered.

Defines:

- ``Prompt``: the built prompt's token ids and what the match saw (one frozen result).
- ``PromptBuilder``: the renderers per template variables, rendering large prompts off the
  event loop, and ``build``: only the new tail rendered after a served turn when the
  template allows it, else the whole conversation.

Why a builder of its own: the prompt is the one step of a turn that depends on the
session's history (match, linear reset, the served tokens a continuation extends), and
its result is all the gateway needs to sample and, afterwards, to commit the turn.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from core.gateway.config import GatewayConfig
from core.gateway.errors import SURROGATE_HINT, bad_request, context_length_exceeded
from core.gateway.history import Node, Turn, match_path, reserve_prompt
from core.gateway.messages import Unit
from core.gateway.render import (
    ChatRenderer,
    InvalidText,
    PromptTooLong,
    ServedTurn,
    TailUnsupported,
    TemplateRefused,
)
from core.gateway.safejson import lone_surrogate
from core.gateway.session import Session
from core.gateway.turn import TurnRequest
from core.types import DEFAULT_POLICY

__all__ = ["RENDER_THREADS", "RENDER_VARIANTS", "Prompt", "PromptBuilder"]

_R = TypeVar("_R")

RENDER_THREADS = 2
"""Worker threads for large renders (``PromptBuilder.render``), per gateway."""

RENDER_VARIANTS = 8
"""Renderers kept for requests' own template variables (``PromptBuilder.renderer_for``)."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """A built prompt and what the gateway needs to commit its turn later."""

    tokens: list[int]
    """The prompt's token ids: the buffer the turn's generated tokens are appended to."""
    parent: Turn | None
    """The served turn whose tokens the prompt extends; None after a full render."""
    owned: bool
    """``tokens`` is ``parent.buf`` (``reserve_prompt``): give it back with ``release`` when
    the turn is not recorded."""
    path: list[Node]
    """The tree's nodes the request's first ``matched`` units matched."""
    matched: int
    """How many of the request's units matched the tree."""
    tree_version: int
    """``Session.tree_version`` right after the match."""
    at_chain_end: bool
    """Linear mode: the turn will extend the session's chain (it attaches at the chain's end)."""
    reused_raws: list[Any] | None
    """The kept raws of ``Session.matched`` when the match started from them."""
    policy: str = DEFAULT_POLICY
    """The policy the turn is sampled from (``parent``, when set, is one of its turns)."""


class PromptBuilder:
    """Renders prompts for one gateway: its renderer, the request variants, the render threads."""

    def __init__(self, renderer: ChatRenderer, config: GatewayConfig) -> None:
        self.renderer = renderer
        """The gateway's renderer (the model's template with the config's variables)."""
        self.config = config
        self._variants: OrderedDict[str, ChatRenderer] = OrderedDict()
        self._render_pool: ThreadPoolExecutor | None = None
        self._reuse_matches = True
        """Reuse a session's last match (``Session.matched``); off only to test that it changes nothing."""

    def close_threads(self) -> None:
        """Stop the render threads (started on the first large render): queued renders
        are cancelled and none is left running into interpreter exit. A later large
        render starts them again."""
        pool, self._render_pool = self._render_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def renderer_for(self, template_kwargs: dict[str, Any] | None) -> ChatRenderer:
        """The renderer for a request's template variables (the gateway's own when none);
        the last ``RENDER_VARIANTS`` variants are kept."""
        if not template_kwargs:
            return self.renderer
        try:
            key = json.dumps(template_kwargs, sort_keys=True)
        except (TypeError, ValueError):
            raise bad_request("'chat_template_kwargs' must hold JSON values", param="chat_template_kwargs") from None
        renderer = self._variants.get(key)
        if renderer is None:
            renderer = self._variants[key] = self.renderer.with_kwargs(template_kwargs)
            while len(self._variants) > RENDER_VARIANTS:
                self._variants.popitem(last=False)
        else:
            self._variants.move_to_end(key)
        return renderer

    async def count(
        self,
        s: Session,
        units: Sequence[Unit],
        tools: list[dict[str, Any]] | None,
        size: int,
        template_kwargs: dict[str, Any] | None,
    ) -> int:
        """The prompt's tokens rendered from scratch, under the same budget as a turn (400
        ``context_length_exceeded`` when it could not be sampled)."""
        messages = [m for u in units for m in u.canon()]
        limit = s.max_context_tokens - 1 if s.max_context_tokens else None
        renderer = self.renderer_for(template_kwargs)
        n: int = await self.render(s, units, tools, size, renderer.count, messages, tools, limit=limit)
        if limit is not None and n > limit:
            s.counters["context_length_exceeded"] += 1
            raise context_length_exceeded(n, s.max_context_tokens)
        return n

    async def render(
        self,
        s: Session,
        units: Sequence[Unit],
        tools: list[dict[str, Any]] | None,
        size: int,
        fn: Callable[..., _R],
        *args: Any,
        **kw: Any,
    ) -> _R:
        """``fn(*args, **kw)``: inline when ``size`` is small, else in the render threads.

        Why: rendering and tokenizing run synchronously and the event loop also
        serves every other rollout (and, in process, the trainer). Tokenizing
        megabytes takes seconds; in a worker thread (the tokenizer releases the
        GIL on long texts) it slows only the request that sent them. Small turns
        keep the inline path: a thread hop costs more than their render.

        Raises:
            GatewayError: 400 ``context_length_exceeded`` (refused before tokenizing),
                400 when the chat template refuses the messages or a message (of
                ``units``) or tool holds a lone surrogate.
        """
        try:
            if size < self.config.render_offload_chars:
                return fn(*args, **kw)
            if self._render_pool is None:
                self._render_pool = ThreadPoolExecutor(
                    RENDER_THREADS, thread_name_prefix="tracerl-gateway-render", initializer=_background_priority
                )
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._render_pool, functools.partial(fn, *args, **kw))
        except PromptTooLong as exc:
            s.counters["context_length_exceeded"] += 1
            raise context_length_exceeded(exc.at_least, s.max_context_tokens, at_least=True) from None
        except TemplateRefused as exc:
            raise bad_request(
                f"the model's chat template cannot render these messages ({exc}); check the roles and order "
                "of the messages (e.g. one system message, first)",
                param="messages",
            ) from None
        except InvalidText:
            where = _surrogate_field(units, tools)
            raise bad_request(f"{where} {SURROGATE_HINT}", param=where.split(".")[0].split("[")[0]) from None

    async def build(self, s: Session, req: TurnRequest, policy: str = DEFAULT_POLICY) -> Prompt:
        """The prompt of ``req`` in session ``s``, for a turn of ``policy``.

        Only a served turn of the same policy is extended: a turn of another policy is
        rendered whole and starts a row of its own, as a fork does (a row never mixes
        policies).

        The last recorded turn's match (``Session.matched``) is reused when the tree
        is unchanged since, so a resent history costs one list comparison, not a
        step per message. The context budget is checked on the rendered text before it is tokenized
        (``ChatRenderer.min_tokens``), so an oversized prompt costs a render, not a
        tokenization; large renders run off the event loop (``render``).
        """
        limit = s.max_context_tokens - 1 if s.max_context_tokens else None
        renderer = self.renderer_for(req.template_kwargs)
        cached = s.matched if s.matched is not None and s.matched.version == s.tree_version else None
        path = match_path(s.root, req.units, cached if self._reuse_matches else None)
        k = len(path)
        depth = k
        at_end = False
        if s.history_mode == "linear":
            # Linear: the request must extend the whole current chain, ending on our turn.
            if cached is not None and cached.tip is not None and self._reuse_matches:
                chain_len, tip = cached.chain_len, cached.tip  # the tree is as it was then
            else:
                chain_len = 0
                tip = s.root
                while tip.children:
                    tip = tip.children[-1]
                    chain_len += 1
            if k < chain_len or (path and path[-1].turn is None):
                if s.turns:
                    s.counters["nonlinear_resets"] += 1
                s.root = Node(canon=[])
                path, k, depth = [], 0, 0
                at_end = True
            else:
                at_end = (path[-1] if path else s.root) is tip
        s.tree_version += 1  # the match may have set raws, the reset replaced the tree
        reused = (
            cached.raws
            if cached is not None and self._reuse_matches and k >= len(cached.nodes)
            and path[len(cached.nodes) - 1] is cached.nodes[-1]
            else None
        )
        version = s.tree_version  # before any await: concurrent turns may change the tree
        gen = next((i for i in range(depth - 1, -1, -1) if path[i].turn is not None), -1)
        parent = path[gen].turn if gen >= 0 else None
        if parent is not None and parent.policy == policy:
            tail = [m for node in path[gen + 1 :] for m in node.canon]
            tail += [m for u in req.units[k:] for m in u.canon()]
            size = sum(_message_chars(m) for m in tail)
            # A turn with reasoning: unless told to keep it regardless, the served tokens are
            # extended only when the client sent the reasoning back and the template renders
            # it in history (render_continuation checks); else the template's own rendering
            # of the history starts a new row.
            reasoning = parent.reasoning and not self.config.keep_reasoning
            system = _system_prompt(path[0].canon)
            size += renderer.anchor_chars(req.tools, default=req.size, reasoning=reasoning, system=system)
            try:
                if reasoning and not req.units[gen].canon()[-1].get("reasoning_content"):
                    raise TailUnsupported("the client did not send the turn's reasoning back")
                calls = tuple(c["function"]["name"] for c in path[gen].canon[-1].get("tool_calls") or ())
                # An empty think block leaves no reasoning, but a template that drops past
                # reasoning would not write it back: read the turn's own tokens.
                thought = "</think>" in renderer.decode(parent.buf[parent.prompt_len : parent.end])
                served = ServedTurn(parent.emitted_closer, reasoning=reasoning, calls=calls, system=system,
                                    thought=thought)
                delta = await self.render(
                    s, req.units, req.tools, size, renderer.render_continuation, tail, req.tools, served,
                    limit=None if limit is None else limit - parent.end, already=parent.end,
                    keep=self.config.keep_reasoning,
                )
            except TailUnsupported:
                s.counters["tail_fallbacks"] += 1
            else:
                prompt, owned = reserve_prompt(parent, delta)
                return Prompt(prompt, parent, owned, path, k, version, at_end, reused, policy)
        s.counters["full_renders"] += 1
        messages = [m for u in req.units for m in u.canon()]
        prompt = await self.render(
            s, req.units, req.tools, req.size, renderer.render_prompt, messages, req.tools, limit=limit
        )
        return Prompt(prompt, None, False, path, k, version, at_end, reused, policy)


def _surrogate_field(units: Sequence[Unit], tools: list[dict[str, Any]] | None) -> str:
    """The request field (``messages[2].content``) holding a lone surrogate (rare path: a walk)."""
    for u in units:
        where = lone_surrogate(u.raw[1] if u.index < 0 else u.raw)
        if where is not None:
            return ("system" if u.index < 0 else f"messages[{u.index}]") + where
    where = lone_surrogate(tools) if tools else None
    return "tools" + where if where is not None else "a message"


def _system_prompt(first: list[dict[str, Any]]) -> str | None:
    """The system prompt of a conversation whose first unit's messages are ``first`` (None
    without one): the anchor a tail is rendered after starts with it (``ServedTurn.system``)."""
    head = first[0] if first else None
    if head is None or head.get("role") != "system" or not isinstance(head.get("content"), str):
        return None
    return str(head["content"])


def _message_chars(message: dict[str, Any]) -> int:
    """Rough size of a canonical message's text: its content and its tool calls'
    arguments (which a client can make as large as any content)."""
    content = message.get("content") or ""
    size = len(content) if isinstance(content, str) else len(str(content))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            size += len(str(function.get("arguments") or ""))
    return size


def _background_priority() -> None:
    """Lower this render thread's CPU priority (Linux niceness is per thread): on a busy
    machine the event loop, which serves every other turn, gets the cores first."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
    except (AttributeError, OSError):  # not Linux, or not allowed: normal priority
        return

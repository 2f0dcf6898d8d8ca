"""The gateway service: sessions, turns and traces, independent of HTTP.

Defines:

- ``Gateway``: the in-process API the trainer uses (``create_session``,
  ``finish_session``, ``drop_session``, ``set_sampler``) and the dialect-neutral
  ``run_turn`` the HTTP routes call.
- ``TurnRequest`` / ``TurnResult``: what a route hands ``run_turn`` and gets back.

Sampling precedence (documented in docs/gateway.md): the session's
``SamplingParams`` are the defaults; a request may lower ``max_tokens`` and add
stop strings; it may set temperature/top_p/top_k only when the session allows
overrides (``GatewayConfig.allow_sampling_overrides`` or the per-session flag),
otherwise the session's values win and the ignored request is counted. Every
turn records the parameters it was sampled with (row metadata ``turn_params``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core.errors import ConfigError
from core.gateway.config import GatewayConfig
from core.gateway.errors import (
    SURROGATE_HINT,
    GatewayError,
    bad_request,
    context_length_exceeded,
    generation_aborted,
    sampler_failed,
    session_closed,
    unauthorized,
)
from core.gateway.history import (
    Matched,
    Node,
    Turn,
    build_rows,
    match_path,
    release,
    reserve_prompt,
)
from core.gateway.late_rewards import LateRewards
from core.gateway.messages import Unit, canonical_tool_call, raws_of
from core.gateway.parsed_output import ParsedOutput
from core.gateway.reasoning_parsers import get_reasoning_parser, prompt_opens_think
from core.gateway.reasoning_switches import template_reasoning
from core.gateway.render import (
    ChatRenderer,
    InvalidText,
    PromptTooLong,
    TailUnsupported,
    TemplateRefused,
)
from core.gateway.safejson import lone_surrogate
from core.gateway.session import Session, new_session_id
from core.gateway.strict import split_strict
from core.gateway.tokentext import TokenLogprob, TokenText
from core.gateway.toolchoice import AUTO, ToolChoice, enforce
from core.gateway.toolparse import get_parser, kept_call_ids, new_call_id
from core.interfaces import Sampler
from core.tokenizer import end_of_turn_ids
from core.types import FinishReason, SampleResult, SamplingParams, TraceRecord

__all__ = ["Gateway", "TurnRequest", "TurnResult"]

HISTORY_MODES = ("linear", "tree")

_R = TypeVar("_R")

RENDER_THREADS = 2
"""Worker threads for large renders (``Gateway._render``), per gateway."""

_THINK_TAIL = 24
"""Prompt tokens ``_prompt_opens_think`` decodes: enough for ``<think>\\n`` spelled in bytes."""

RENDER_VARIANTS = 8
"""Renderers kept for requests' own template variables (``Gateway.renderer_for``)."""


@dataclass
class TurnRequest:
    """A chat request in dialect-neutral form."""

    units: Sequence[Unit]
    """The conversation, one unit per wire message (``messages.Units`` from the routes)."""
    tools: list[dict[str, Any]] | None = None
    """Tools in chat-template form."""
    max_tokens: int | None = None
    """Requested generation cap (may only lower the session's)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    """Extra stop strings."""
    tool_choice: ToolChoice = AUTO
    """Which parsed calls the reply may return (``core.gateway.toolchoice``)."""
    seed: int | None = None
    """The client's seed, mixed into the call's seed (``call_seed``)."""
    logprobs: bool = False
    """Return each sampled token's logprob (``TurnResult.logprobs``)."""
    template_kwargs: dict[str, Any] | None = None
    """Template variables for this request only (``core.gateway.reasoning_switches``)."""
    strict: dict[str, Any] | None = None
    """Schemas of the tools sent with ``strict: true``, by name (``core.gateway.strict``)."""
    size: int = 0
    """Bytes of the request body; a full render of a body of ``GatewayConfig.render_offload_chars``
    or more runs in a worker thread."""


@dataclass
class TurnResult:
    """What the model answered, ready for either dialect."""

    content: str
    """Assistant text (without tool-call markup unless ill-formed)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Canonical tool calls (``id``, ``function.name``, ``function.arguments`` dict)."""
    finish_reason: FinishReason = FinishReason.STOP
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ill_formed: bool = False
    stop_string: str | None = None
    """The stop string that ended the turn, if one did."""
    tool_choice_violated: bool = False
    """The model did not follow the request's ``tool_choice`` (``toolchoice.enforce``)."""
    logprobs: list[TokenLogprob] | None = None
    """When asked for: every sampled token but the end-of-turn token that closed the turn."""
    reasoning: str = ""
    """Reasoning split off the turn's text (``<think>…</think>``); '' when none. OpenAI chat
    returns it as ``reasoning_content``, Anthropic messages as a ``thinking`` block."""


def _check_sampler(sampler: Any) -> Sampler:
    if not callable(getattr(sampler, "sample", None)):
        raise ConfigError(f"sampler {sampler!r} has no async sample(prompt_token_ids, params, *, session_id) method")
    return sampler  # type: ignore[no-any-return]


class Gateway:
    """Sessions, rendering, sampling and trace capture for one model."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        sampler: Sampler,
        config: GatewayConfig | None = None,
        model_id: str = "tracerl",
        generation_config: Any = None,
    ) -> None:
        """Build a gateway.

        Args:
            tokenizer: The model's Hugging Face tokenizer (chat template included).
            sampler: Backend that generates tokens (see ``core.interfaces.Sampler``).
            config: Rendering, history and limit settings.
            model_id: Name reported by ``/v1/models`` and in responses.
            generation_config: The model's generation config (or a dict) whose
                ``eos_token_id`` lists end-of-turn ids; None reads the
                ``generation_config.json`` beside the tokenizer's files when there is one.
                A sampler's own ``end_of_turn_ids`` (the local backend's, read from its
                model) are added too, so the gateway knows every id the sampler stops on.

        Raises:
            ConfigError: bad history mode, unknown tool parser, a template whose
                tool format no parser knows, or a tokenizer without a template.
        """
        self.config = config or GatewayConfig()
        if self.config.history_mode not in HISTORY_MODES:
            raise ConfigError(f"gateway.history_mode is {self.config.history_mode!r}; choose one of {HISTORY_MODES}")
        self.model_id = model_id
        self.late_rewards = LateRewards()
        """Rewards posted after their rollout finished (``POST /admin/rollouts/{id}/reward``
        feeds it; the rollout runner waits on it)."""
        self.renderer = ChatRenderer(tokenizer, self.config.chat_template_kwargs)
        self._token_text = TokenText(tokenizer)
        self.reasoning = template_reasoning(self.renderer.template or "")
        """The template's reasoning switches (what ``thinking`` / ``reasoning_effort`` may ask)."""
        self._variants: OrderedDict[str, ChatRenderer] = OrderedDict()
        self.tool_parser_name, self._parse = get_parser(self.config.tool_parser, self.renderer.template or "")
        self.reasoning_parser_name, self._split_reasoning = get_reasoning_parser(
            self.config.reasoning_parser, self.renderer.template or ""
        )
        self._sampler = _check_sampler(sampler)
        self.admin_token = self.config.admin_token or secrets.token_urlsafe(32)
        self._sessions: dict[str, Session] = {}
        self._render_pool: ThreadPoolExecutor | None = None
        own = end_of_turn_ids(tokenizer, generation_config=generation_config)
        from_sampler = (int(i) for i in getattr(sampler, "end_of_turn_ids", None) or ())
        self.end_of_turn_ids: tuple[int, ...] = tuple(dict.fromkeys((*own, *from_sampler)))
        """Token ids that end the model's turn; every turn is sampled with them as stop ids."""
        self._stop_ids: frozenset[int] = frozenset(self.end_of_turn_ids)
        self._reuse_matches = True
        """Reuse a session's last match (``Session.matched``); off only to test that it changes nothing."""

    # ------------------------------------------------------------------ trainer API

    @property
    def sampler(self) -> Sampler:
        """The sampler new turns use."""
        return self._sampler

    def close_render_threads(self) -> None:
        """Stop the render threads (started on the first large render): queued renders
        are cancelled and none is left running into interpreter exit. A later large
        render starts them again."""
        pool, self._render_pool = self._render_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def set_sampler(self, sampler: Sampler) -> None:
        """Rebind after a weight sync; turns already in flight finish on the old sampler."""
        self._sampler = _check_sampler(sampler)

    def create_session(
        self,
        *,
        sampling: SamplingParams | None = None,
        max_context_tokens: int | None = None,
        metadata: dict[str, Any] | None = None,
        history_mode: str | None = None,
        allow_sampling_overrides: bool | None = None,
    ) -> str:
        """Open a session and return its id (the agent's API key).

        Args:
            sampling: Per-turn defaults; ``SamplingParams()`` when None. The model's
                end-of-turn ids (``end_of_turn_ids``) are added to its ``stop_token_ids``.
            max_context_tokens: Prompt + generation budget; None takes the config's, 0 is unlimited.
            metadata: Free data; ``rollout_id`` and ``group_id`` are copied onto rows.
            history_mode: ``linear`` or ``tree``; None takes the config's.
            allow_sampling_overrides: Let requests set temperature/top_p/top_k.
        """
        mode = history_mode or self.config.history_mode
        if mode not in HISTORY_MODES:
            raise ConfigError(f"history_mode is {mode!r}; choose one of {HISTORY_MODES}")
        budget = self.config.max_context_tokens if max_context_tokens is None else max_context_tokens
        if budget < 0:
            raise ConfigError(f"max_context_tokens must be >= 0 (0 = unlimited), got {budget!r}")
        sampling = sampling or SamplingParams()
        stop_ids = tuple(dict.fromkeys((*sampling.stop_token_ids, *self.end_of_turn_ids)))
        if stop_ids != sampling.stop_token_ids:
            # Every end-of-turn id is a stop id, so no sampler generates past the turn.
            sampling = dataclasses.replace(sampling, stop_token_ids=stop_ids)
        sid = new_session_id()
        self._sessions[sid] = Session(
            id=sid,
            sampling=sampling,
            max_context_tokens=budget,
            history_mode=mode,
            allow_sampling_overrides=(
                self.config.allow_sampling_overrides if allow_sampling_overrides is None else allow_sampling_overrides
            ),
            metadata=dict(metadata or {}),
        )
        return sid

    def session(self, sid: str) -> Session:
        """The session ``sid`` (open or closed); 401 ``GatewayError`` when unknown."""
        s = self._sessions.get(sid)
        if s is None:
            raise unauthorized(
                f"unknown session id {_redact(sid)}: sessions are created by the trainer (or POST "
                "/admin/sessions) and the agent passes the id as its API key; it may also have been dropped"
            )
        return s

    def sessions(self) -> list[Session]:
        """All sessions, open and closed."""
        return list(self._sessions.values())

    def peek_rows(self, sid: str) -> list[TraceRecord]:
        """The rows ``sid`` would yield now, without closing it."""
        s = self.session(sid)
        meta: dict[str, Any] = dict(s.counters)
        meta["turns"] = len(s.turns)
        meta["tool_parser"] = self.tool_parser_name
        meta["reasoning_parser"] = self.reasoning_parser_name
        meta["history_mode"] = s.history_mode
        meta["in_flight_at_finish"] = s.in_flight
        rows = build_rows(
            sid, s.turns, rollout_id=s.metadata.get("rollout_id"), group_id=s.metadata.get("group_id"), metadata=meta
        )
        return rows

    def finish_session(self, sid: str) -> list[TraceRecord]:
        """Close ``sid`` and return its rows; later requests get 409.

        Turns still in flight are not included (``in_flight_at_finish`` says how
        many); use ``afinish_session`` to wait for them first.
        """
        s = self.session(sid)
        if s.closed:
            raise session_closed(f"session {_redact(sid)} was already finished")
        rows = self.peek_rows(sid)
        s.closed = True
        s.release()
        return rows

    async def afinish_session(self, sid: str, *, wait_s: float = 5.0) -> list[TraceRecord]:
        """Wait up to ``wait_s`` for in-flight turns, then ``finish_session``."""
        s = self.session(sid)
        if s.in_flight:
            s.idle = s.idle or asyncio.Event()
            try:
                await asyncio.wait_for(s.idle.wait(), wait_s)
            except TimeoutError:
                pass
        return self.finish_session(sid)

    def drop_session(self, sid: str) -> None:
        """Forget ``sid`` entirely (later requests get 401); unknown ids are ignored."""
        s = self._sessions.pop(sid, None)
        if s is not None:
            s.closed = True
            s.release()

    def open_session(self, sid: str) -> Session:
        """The open session ``sid``: 401 when unknown, 409 when finished."""
        s = self.session(sid)
        if s.closed:
            raise session_closed(
                f"session {_redact(sid)} is finished: its trace was handed to the trainer and it accepts no more turns"
            )
        return s

    # ------------------------------------------------------------------ turns

    async def count_prompt(
        self,
        sid: str,
        units: Sequence[Unit],
        tools: list[dict[str, Any]] | None,
        *,
        size: int = 0,
        template_kwargs: dict[str, Any] | None = None,
    ) -> int:
        """What ``count_tokens`` answers for session ``sid``: the prompt's tokens rendered from
        scratch, under the same budget as a turn (400 ``context_length_exceeded`` when it
        could not be sampled), rendered off the event loop when large."""
        s = self.open_session(sid)
        messages = [m for u in units for m in u.canon()]
        limit = s.max_context_tokens - 1 if s.max_context_tokens else None
        renderer = self.renderer_for(template_kwargs)
        n: int = await self._render(s, units, tools, size, renderer.count, messages, tools, limit=limit)
        if limit is not None and n > limit:
            s.counters["context_length_exceeded"] += 1
            raise context_length_exceeded(n, s.max_context_tokens)
        return n

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

    async def _render(
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

    def _params(self, s: Session, req: TurnRequest) -> SamplingParams:
        base = s.sampling
        changes: dict[str, Any] = {}
        if req.max_tokens is not None:
            if req.max_tokens < 1:
                raise bad_request(f"max_tokens must be >= 1, got {req.max_tokens!r}", param="max_tokens")
            changes["max_tokens"] = min(req.max_tokens, base.max_tokens)
        asked = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
        asked = {k: v for k, v in asked.items() if v is not None and v != getattr(base, k)}
        if asked:
            if s.allow_sampling_overrides:
                changes.update(asked)
            else:
                s.counters["sampling_overrides_ignored"] += 1
        if req.stop:
            changes["stop"] = tuple(dict.fromkeys((*base.stop, *req.stop)))
        if not changes:
            return base
        try:
            return dataclasses.replace(base, **changes)
        except ValueError as exc:
            raise bad_request(str(exc)) from None

    async def _build_prompt(
        self, s: Session, req: TurnRequest
    ) -> tuple[list[int], Turn | None, bool, list[Node], int, Mark]:
        """(prompt, parent turn, owned, matched path, units matched, ``Mark``) for this request.

        The last recorded turn's match (``Session.matched``) is reused when the tree
        is unchanged since, so a resent history costs one list comparison, not a
        step per message. The context budget is checked on the rendered text before it is tokenized
        (``ChatRenderer.min_tokens``), so an oversized prompt costs a render, not a
        tokenization; large renders run off the event loop (``_render``).
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
        mark = Mark(s.tree_version, at_end, reused)
        gen = next((i for i in range(depth - 1, -1, -1) if path[i].turn is not None), -1)
        if gen >= 0:
            parent = path[gen].turn
            assert parent is not None
            tail = [m for node in path[gen + 1 :] for m in node.canon]
            tail += [m for u in req.units[k:] for m in u.canon()]
            size = sum(_message_chars(m) for m in tail)
            # A turn with reasoning: unless told to keep it regardless, the served tokens are
            # extended only when the client sent the reasoning back and the template renders
            # it in history (render_continuation checks); else the template's own rendering
            # of the history starts a new row.
            reasoning = parent.reasoning and not self.config.keep_reasoning
            size += renderer.anchor_chars(req.tools, default=req.size, reasoning=reasoning)
            try:
                if reasoning and not req.units[gen].canon()[-1].get("reasoning_content"):
                    raise TailUnsupported("the client did not send the turn's reasoning back")
                delta = await self._render(
                    s, req.units, req.tools, size, renderer.render_continuation, tail, req.tools, parent.emitted_closer,
                    limit=None if limit is None else limit - parent.end, already=parent.end, reasoning=reasoning,
                    keep=self.config.keep_reasoning,
                    calls=[c["function"]["name"] for c in path[gen].canon[-1].get("tool_calls") or ()],
                )
            except TailUnsupported:
                s.counters["tail_fallbacks"] += 1
            else:
                prompt, owned = reserve_prompt(parent, delta)
                return prompt, parent, owned, path, k, mark
        s.counters["full_renders"] += 1
        messages = [m for u in req.units for m in u.canon()]
        prompt = await self._render(
            s, req.units, req.tools, req.size, renderer.render_prompt, messages, req.tools, limit=limit
        )
        return prompt, None, False, path, k, mark

    async def run_turn(self, sid: str, req: TurnRequest) -> TurnResult:
        """Render, sample, parse and record one turn of session ``sid``.

        Raises:
            GatewayError: 401/409 session problems, 400 bad input or context
                overflow, 503 sampler failure or a generation the sampler aborted
                (``generation_aborted``, counted in ``aborted_turns``). Nothing is
                recorded then, nor when the call is cancelled (client gone).
        """
        s = self.open_session(sid)
        cap = self.config.max_turns_per_session
        if cap and len(s.turns) + s.in_flight >= cap:
            raise bad_request(
                f"session {_redact(sid)} has reached the gateway's limit of {cap} turns "
                "(gateway.max_turns_per_session); finish it and start a new session, or raise the limit",
                code="session_turn_limit",
            )
        if req.tools and self._parse is None:
            raise bad_request(
                "this gateway has no tool-call parser (gateway.tool_parser='none'), so it cannot offer tools; "
                "set gateway.tool_parser for this model",
                param="tools",
            )
        params = self._params(s, req)
        prompt, parent, owned, path, k, mark = await self._build_prompt(s, req)
        try:
            if s.closed:  # finished while a large prompt rendered in a worker thread
                raise session_closed(f"session {_redact(sid)} was finished while this turn's prompt was rendered")
            if s.max_context_tokens:
                room = s.max_context_tokens - len(prompt)
                if room < 1:
                    s.counters["context_length_exceeded"] += 1
                    raise context_length_exceeded(len(prompt), s.max_context_tokens)
                if room < params.max_tokens:
                    params = dataclasses.replace(params, max_tokens=room)
            prompt_len = len(prompt)
            # The seed index is taken when the call starts, not when a turn is recorded:
            # concurrent turns of one session (best-of-N, parallel sub-calls) must not share it.
            call = s.sampler_calls
            s.sampler_calls += 1
            seed = call_seed(params.seed, req.seed, call)
            if seed != params.seed:
                params = dataclasses.replace(params, seed=seed)
            result = await self._sample(s, prompt, params)
            if s.closed:
                raise session_closed(f"session {_redact(sid)} was finished while this turn was being generated")
            if result.finish_reason is FinishReason.ABORT:
                # The backend gave up on the turn (weight swap, shutdown): the agent never
                # gets it, so it is not recorded and nothing of it is trained.
                s.counters["aborted_turns"] += 1
                raise generation_aborted(
                    f"the sampling backend aborted this generation after {len(result.token_ids)} tokens "
                    "(weights swapped or the engine shut down); nothing was recorded, retry the request"
                )
        except BaseException as exc:
            release(parent, owned)
            if isinstance(exc, asyncio.CancelledError):
                s.counters["disconnected_turns"] += 1
            raise
        return self._record(s, req, params, prompt, prompt_len, parent, path, k, mark, result)

    async def _sample(self, s: Session, prompt: list[int], params: SamplingParams) -> SampleResult:
        sampler = self._sampler  # in-flight turns keep the sampler they started on
        s.in_flight += 1
        try:
            result = await sampler.sample(prompt, params, session_id=s.id)
        except (GatewayError, asyncio.CancelledError):
            raise
        except Exception as exc:
            s.counters["sampler_errors"] += 1
            raise sampler_failed(f"the sampling backend failed: {type(exc).__name__}: {exc}") from exc
        finally:
            s.in_flight -= 1
            if s.in_flight == 0 and s.idle is not None:
                s.idle.set()
        if not isinstance(result, SampleResult) or len(result.token_ids) > params.max_tokens:
            s.counters["sampler_errors"] += 1
            raise sampler_failed(
                f"the sampler returned {type(result).__name__} with "
                f"{len(getattr(result, 'token_ids', ()))} tokens for max_tokens={params.max_tokens}"
            )
        return result

    def _record(
        self,
        s: Session,
        req: TurnRequest,
        params: SamplingParams,
        prompt: list[int],
        prompt_len: int,
        parent: Turn | None,
        path: list[Node],
        k: int,
        mark: Mark,
        result: SampleResult,
    ) -> TurnResult:
        ids = list(result.token_ids)
        emitted = ""
        body = ids
        if ids and (ids[-1] in self._stop_ids or ids[-1] in params.stop_token_ids):
            emitted = self.renderer.decode(ids[-1:])
            body = ids[:-1]
        text = self.renderer.decode(body)
        stop_string = None
        if params.stop and not emitted and result.finish_reason is FinishReason.STOP:
            hits = [(text.find(st), st) for st in params.stop if st and st in text]
            if hits:
                at, stop_string = min(hits)
                text = text[:at]
        reasoning = ""
        if self._split_reasoning is not None:
            reasoning, text = self._split_reasoning(text, self._prompt_opens_think(prompt, prompt_len))
        parsed = self._parse_reply(text) if req.tools else ParsedOutput(content=text)
        offered = {t["function"]["name"] for t in req.tools or ()}
        for name, _ in parsed.tool_calls:
            if name not in offered:
                s.counters["unknown_tool_calls"] += 1
        if parsed.ill_formed:
            s.counters["ill_formed_tool_calls"] += 1
        fitting, misfits = split_strict(req.strict, parsed.tool_calls)
        content = parsed.content if fitting or not parsed.tool_calls else text
        reply = enforce(req.tool_choice, content, fitting, text)
        if misfits:  # calls to strict tools whose arguments break the schema: not returned
            s.counters["strict_violations"] += misfits
            reply.dropped += misfits
            reply.violated = True
        if req.tool_choice.mode != "auto" and parsed.ill_formed:
            reply.violated = True  # a required call that did not parse, or a refused call attempted
        s.counters["tool_calls_dropped"] += reply.dropped
        s.counters["tool_choice_violations"] += reply.violated
        calls = [
            canonical_tool_call(ident or new_call_id(self.tool_parser_name), name, args)
            for (name, args), ident in zip(reply.calls, kept_call_ids(parsed, reply.calls, s.call_ids), strict=True)
        ]
        s.call_ids.update(call["id"] for call in calls)
        prompt.extend(ids)
        turn = Turn(
            buf=prompt,
            prompt_len=prompt_len,
            end=len(prompt),
            logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
            weight_version=result.weight_version,
            params={
                "max_tokens": params.max_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "seed": params.seed,
            },
            parent=parent,
            emitted_closer=emitted,
            ill_formed=parsed.ill_formed,
            choice_violated=reply.violated,
            reasoning=bool(reasoning),
        )
        s.turns.append(turn)
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            assistant["tool_calls"] = calls
        if reasoning:
            assistant["reasoning_content"] = reasoning
        node = path[-1] if path else s.root
        nodes = list(path)
        for unit in req.units[k:]:
            child = Node(canon=unit.canon(), raw=unit.raw)
            node.children.append(child)
            node = child
            nodes.append(child)
        answer = Node(canon=[assistant], turn=turn)
        node.children.append(answer)
        s.tree_version += 1
        s.matched = None
        if mark.version == s.tree_version - 1 and nodes:
            # Nothing changed the tree between this turn's match and now: ``nodes`` is what
            # match_path returns for these messages until the tree changes again. The raws
            # already kept stand in for the equal ones just parsed, so a session keeps one
            # copy of its history's JSON, not two.
            raws = raws_of(req.units)
            kept = mark.reused + raws[len(mark.reused) :] if mark.reused is not None else list(raws)
            s.matched = Matched(s.tree_version, kept, nodes, len(nodes) + 1, answer if mark.at_end else None)
        return TurnResult(
            content=reply.content,
            tool_calls=calls,
            finish_reason=result.finish_reason,
            prompt_tokens=prompt_len,
            completion_tokens=len(ids),
            ill_formed=parsed.ill_formed,
            stop_string=stop_string,
            tool_choice_violated=reply.violated,
            logprobs=self._token_text.logprobs(body, result.logprobs[: len(body)]) if req.logprobs else None,
            reasoning=reasoning,
        )


    def _prompt_opens_think(self, prompt: list[int], prompt_len: int) -> bool:
        """The generation prompt ended inside a ``<think>`` block the template opened (DeepSeek R1,
        Qwen3 Thinking-2507), so the turn starts in its reasoning. Read from the prompt's last
        tokens (a few, decoded: the tags may be special tokens or several byte-level ones);
        only the ``think`` parser asks."""
        if self.reasoning_parser_name != "think":
            return False
        return prompt_opens_think(self.renderer.decode(prompt[max(0, prompt_len - _THINK_TAIL) : prompt_len]))

    def _parse_reply(self, text: str) -> ParsedOutput:
        """The tool parser's reading of a reply; any failure is an ill-formed call, never an error:
        the turn was sampled, so it is recorded (and counted) whatever the model wrote."""
        if self._parse is None:
            return ParsedOutput(content=text)
        try:
            return self._parse(text)
        except Exception as exc:
            return ParsedOutput(content=text, ill_formed=True, error=f"parser failed: {type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class Mark:
    """What ``_build_prompt`` hands ``_record`` about the tree it matched against."""

    version: int
    """``Session.tree_version`` right after the match."""
    at_end: bool
    """Linear mode: the turn will extend the session's chain (it attaches at the chain's end)."""
    reused: list[Any] | None
    """The kept raws of ``Session.matched`` when the match started from them."""


def _surrogate_field(units: Sequence[Unit], tools: list[dict[str, Any]] | None) -> str:
    """The request field (``messages[2].content``) holding a lone surrogate (rare path: a walk)."""
    for u in units:
        where = lone_surrogate(u.raw[1] if u.index < 0 else u.raw)
        if where is not None:
            return ("system" if u.index < 0 else f"messages[{u.index}]") + where
    where = lone_surrogate(tools) if tools else None
    return "tools" + where if where is not None else "a message"


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


def call_seed(session_seed: int | None, client_seed: int | None, call: int) -> int | None:
    """Seed of a session's sampler call ``call`` (0-based, counted when the call starts).

    Without a client seed: ``turn_seed(session_seed, call)`` (None when the session
    is unseeded). With one (OpenAI ``seed``), it feeds in deterministically: a seeded
    session uses ``turn_seed(mix(session_seed, client_seed), call)``, so rollouts of a
    group (each session seeded apart, as the training loop does) still sample apart
    when their agent hard-codes ``seed=42``; an unseeded session takes the client's
    seed as its session seed, ``turn_seed(client_seed mod 2**63, call)``, so the same
    agent run against fresh sessions reproduces its samples.
    """
    if client_seed is None:
        return None if session_seed is None else turn_seed(session_seed, call)
    if session_seed is None:
        return turn_seed(client_seed % 2**63, call)
    digest = hashlib.blake2b(f"{session_seed}:{client_seed}".encode(), digest_size=8).digest()
    return turn_seed(int.from_bytes(digest, "big") % 2**63, call)


def turn_seed(seed: int, turn: int) -> int:
    """Seed of sampler call ``turn`` (0-based, counted per session when the call starts)
    of a session seeded with ``seed``: a seeded session draws fresh randomness each
    call, concurrent calls included, reproducibly."""
    return seed if turn == 0 else (seed + 1_000_003 * turn) % (2**63)


def _redact(sid: str) -> str:
    """Enough of a session id to recognise it in logs, not enough to use it."""
    return repr(sid[:10] + "…") if len(sid) > 12 else repr(sid)

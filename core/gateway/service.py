"""The gateway service: sessions, turns and traces, independent of HTTP.

Defines:

- ``Gateway``: the in-process API the trainer uses (``create_session``,
  ``finish_session``, ``drop_session``, ``set_sampler``) and the dialect-neutral
  ``run_turn`` the HTTP routes call (``TurnRequest`` in, ``TurnResult`` out:
  ``core.gateway.turn``).

A turn, in the order ``run_turn`` takes it: its sampling parameters
(``core.gateway.sampling``), its prompt (``core.gateway.prompt``), the sampler call,
the reply read (``core.gateway.reply``, a pure function), and the commit: the turn's
tokens, counters and messages recorded in the session (``core.gateway.commit``).
Nothing is recorded for a turn that fails before its commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
from collections.abc import Sequence
from typing import Any

from core.errors import ConfigError, ContextLengthError
from core.gateway.commit import commit_turn
from core.gateway.config import GatewayConfig
from core.gateway.errors import (
    GatewayError,
    bad_request,
    context_length_exceeded,
    generation_aborted,
    sampler_failed,
    session_closed,
    unauthorized,
)
from core.gateway.history import Turn, build_rows, release
from core.gateway.late_rewards import LateRewards
from core.gateway.messages import Unit, canonical_tool_call
from core.gateway.policies import PolicyRoutes
from core.gateway.prompt import Prompt, PromptBuilder
from core.gateway.reasoning_parsers import (
    get_reasoning_parser,
    prompt_closes_think,
    prompt_opens_think,
)
from core.gateway.reasoning_switches import template_reasoning
from core.gateway.render import ChatRenderer
from core.gateway.reply import ReplyFormat, ReplySettings, read_reply
from core.gateway.sampling import call_seed, turn_params
from core.gateway.session import Session, new_session_id
from core.gateway.tokentext import TokenText
from core.gateway.toolparse import call_markers, get_parser, kept_call_ids, new_call_id
from core.gateway.turn import TurnRequest, TurnResult
from core.interfaces import Sampler
from core.tokenizer import end_of_turn_ids
from core.types import FinishReason, SampleResult, SamplingParams, TraceRecord

__all__ = ["Gateway"]

HISTORY_MODES = ("linear", "tree")

_THINK_TAIL = 24
"""Prompt tokens ``_prompt_think`` decodes: enough for ``<think>\\n`` spelled in bytes."""


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
        policies: PolicyRoutes | None = None,
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
            policies: The policies turns are routed to by their ``model``; None: one,
                ``DEFAULT_POLICY``, which every turn belongs to (docs/multi_agent.md).

        Raises:
            ConfigError: bad history mode, unknown tool parser, a template whose
                tool format no parser knows, or a tokenizer without a template.
        """
        self.config = config or GatewayConfig()
        if self.config.history_mode not in HISTORY_MODES:
            raise ConfigError(f"gateway.history_mode is {self.config.history_mode!r}; choose one of {HISTORY_MODES}")
        self.model_id = model_id
        self.policies = policies or PolicyRoutes()
        """The policies served and the model names routed to each (``core.gateway.policies``)."""
        self.late_rewards = LateRewards()
        """Rewards posted after their rollout finished (``POST /admin/rollouts/{id}/reward``
        feeds it; the rollout runner waits on it)."""
        self.renderer = ChatRenderer(tokenizer, self.config.chat_template_kwargs)
        self.prompts = PromptBuilder(self.renderer, self.config)
        """Builds each turn's prompt (``core.gateway.prompt``)."""
        self._token_text = TokenText(tokenizer)
        self.reasoning_switches = template_reasoning(self.renderer.template or "")
        """The template's reasoning switches (what ``thinking`` / ``reasoning_effort`` may ask)."""
        self.tool_parser_name, self._parse = get_parser(self.config.tool_parser, self.renderer.template or "")
        self.reasoning_parser_name, self._split_reasoning = get_reasoning_parser(
            self.config.reasoning_parser, self.renderer.template or ""
        )
        self._samplers: dict[str, Sampler] = {self.policies.default: _check_sampler(sampler)}
        """Each policy's sampler; a policy with none set samples with the default policy's."""
        self.admin_token = self.config.admin_token or secrets.token_urlsafe(32)
        self._sessions: dict[str, Session] = {}
        own = end_of_turn_ids(tokenizer, generation_config=generation_config)
        from_sampler = (int(i) for i in getattr(sampler, "end_of_turn_ids", None) or ())
        self.end_of_turn_ids: tuple[int, ...] = tuple(dict.fromkeys((*own, *from_sampler)))
        """Token ids that end the model's turn; every turn is sampled with them as stop ids."""
        self._reply_format = ReplyFormat(
            decode=self.renderer.decode,
            end_of_turn_ids=frozenset(self.end_of_turn_ids),
            split_reasoning=self._split_reasoning,
            parse_tools=self._parse,
            call_markers=call_markers(self.renderer.template or ""),
        )

    # ------------------------------------------------------------------ trainer API

    @property
    def sampler(self) -> Sampler:
        """The sampler new turns of the default policy use."""
        return self._samplers[self.policies.default]

    def sampler_of(self, policy: str) -> Sampler:
        """The sampler new turns of ``policy`` use (the default policy's until one is set)."""
        return self._samplers.get(policy) or self._samplers[self.policies.default]

    def close_render_threads(self) -> None:
        """Stop the render threads (``PromptBuilder.close_threads``); a later large render
        starts them again."""
        self.prompts.close_threads()

    def set_sampler(self, sampler: Sampler, *, policy: str | None = None) -> None:
        """Rebind ``policy``'s turns (None: the default policy's) after a weight sync; turns
        already in flight finish on the old sampler.

        Raises:
            ConfigError: ``policy`` is not one this gateway serves.
        """
        name = self.policies.default if policy is None else self.policies.check(policy)
        self._samplers[name] = _check_sampler(sampler)

    def create_session(
        self,
        *,
        sampling: SamplingParams | None = None,
        max_context_tokens: int | None = None,
        metadata: dict[str, Any] | None = None,
        history_mode: str | None = None,
        allow_sampling_overrides: bool | None = None,
        policy: str | None = None,
    ) -> str:
        """Open a session and return its id (the agent's API key).

        Args:
            sampling: Per-turn defaults; ``SamplingParams()`` when None. The model's
                end-of-turn ids (``end_of_turn_ids``) are added to its ``stop_token_ids``.
            max_context_tokens: Prompt + generation budget; None takes the config's, 0 is unlimited.
            metadata: Free data; ``rollout_id`` and ``group_id`` are copied onto rows.
            history_mode: ``linear`` or ``tree``; None takes the config's.
            allow_sampling_overrides: Let requests set temperature/top_p/top_k.
            policy: The policy of turns whose request names none; None: the first of
                ``policies``. ``ConfigError`` for one the gateway does not serve.
        """
        mode = history_mode or self.config.history_mode
        if mode not in HISTORY_MODES:
            raise ConfigError(f"history_mode is {mode!r}; choose one of {HISTORY_MODES}")
        budget = self.config.max_context_tokens if max_context_tokens is None else max_context_tokens
        if budget < 0:
            raise ConfigError(f"max_context_tokens must be >= 0 (0 = unlimited), got {budget!r}")
        policy = self.policies.check(policy) if policy is not None else self.policies.default
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
            policy=policy,
        )
        rollout_id = (metadata or {}).get("rollout_id")
        if rollout_id is not None:
            self.late_rewards.opened(str(rollout_id))
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
        return await self.prompts.count(s, units, tools, size, template_kwargs)

    def renderer_for(self, template_kwargs: dict[str, Any] | None) -> ChatRenderer:
        """The renderer for a request's template variables (``PromptBuilder.renderer_for``)."""
        return self.prompts.renderer_for(template_kwargs)

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
        policy = self.policies.route(req.model, s.policy, self.model_id)
        params = turn_params(s, req, policy)
        prompt = await self.prompts.build(s, req, policy)
        try:
            if s.closed:  # finished while a large prompt rendered in a worker thread
                raise session_closed(f"session {_redact(sid)} was finished while this turn's prompt was rendered")
            if s.max_context_tokens:
                room = s.max_context_tokens - len(prompt.tokens)
                if room < 1:
                    s.counters["context_length_exceeded"] += 1
                    raise context_length_exceeded(len(prompt.tokens), s.max_context_tokens)
                if room < params.max_tokens:
                    params = dataclasses.replace(params, max_tokens=room)
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
            release(prompt.parent, prompt.owned)
            if isinstance(exc, asyncio.CancelledError):
                s.counters["disconnected_turns"] += 1
            raise
        return self._commit_turn(s, req, params, prompt, result)

    async def _sample(self, s: Session, prompt: Prompt, params: SamplingParams) -> SampleResult:
        sampler = self.sampler_of(prompt.policy)  # in-flight turns keep the sampler they started on
        s.in_flight += 1
        try:
            result = await sampler.sample(prompt.tokens, params, session_id=s.id)
        except (GatewayError, asyncio.CancelledError):
            raise
        except ContextLengthError as exc:
            # The model's own context (smaller than the gateway's budget): the caller's
            # prompt is too long, which retrying will not fix.
            s.counters["context_length_exceeded"] += 1
            raise context_length_exceeded(
                exc.prompt_tokens, exc.context, setting=exc.setting or "the model's context length"
            ) from None
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
        bad = next((i for i, lp in enumerate(result.logprobs) if not math.isfinite(lp)), None)
        if bad is not None:
            # A NaN or infinite logprob would reach the loss (importance ratios, KL) and
            # poison the whole batch: the turn fails here, as a sampler error.
            s.counters["sampler_errors"] += 1
            raise sampler_failed(
                f"the sampler returned logprob {result.logprobs[bad]!r} for token {bad} of "
                f"{len(result.logprobs)}: logprobs must be finite numbers (check the sampling backend)"
            )
        return result

    def _commit_turn(
        self, s: Session, req: TurnRequest, params: SamplingParams, prompt: Prompt, result: SampleResult
    ) -> TurnResult:
        """Read the sampled reply (``read_reply``), record it as a turn of ``s`` (its tokens
        appended to the prompt's buffer, the turn and its messages committed to the history
        tree) and answer it."""
        prompt_len = len(prompt.tokens)
        opened, closed = self._prompt_think(prompt.tokens, prompt_len)
        settings = ReplySettings(
            stop=params.stop,
            stop_token_ids=params.stop_token_ids,
            tools=tuple(t["function"]["name"] for t in req.tools or ()),
            strict=req.strict,
            tool_choice=req.tool_choice,
            opened_think=opened,
            closed_think=closed,
        )
        reply = read_reply(result.token_ids, result.finish_reason, settings, self._reply_format)
        s.counters["unknown_tool_calls"] += reply.unknown_calls
        s.counters["ill_formed_tool_calls"] += reply.ill_formed
        s.counters["strict_violations"] += reply.strict_misfits
        s.counters["tool_calls_dropped"] += reply.dropped
        s.counters["tool_choice_violations"] += reply.choice_violated
        kept = list(reply.calls)
        calls = [
            canonical_tool_call(ident or new_call_id(self.tool_parser_name), name, args)
            for (name, args), ident in zip(kept, kept_call_ids(reply.parsed, kept, s.call_ids), strict=True)
        ]
        s.call_ids.update(call["id"] for call in calls)
        prompt.tokens.extend(result.token_ids)
        turn = Turn(
            buf=prompt.tokens,
            prompt_len=prompt_len,
            end=len(prompt.tokens),
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
            parent=prompt.parent,
            emitted_closer=reply.closer,
            ill_formed=reply.ill_formed,
            choice_violated=reply.choice_violated,
            # A block the generation prompt opened is reasoning even when empty: templates that
            # open it (DeepSeek R1) leave it out of history, so the next turn must not extend it.
            reasoning=bool(reply.reasoning) or settings.opened_think,
            segments=result.segments,
            parse=reply.parse,
            parse_detail=reply.parse_detail,
            policy=prompt.policy,
        )
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            assistant["tool_calls"] = calls
        if reply.reasoning:
            assistant["reasoning_content"] = reply.reasoning
        commit_turn(s, req.units, prompt, turn, assistant)
        body = reply.body
        return TurnResult(
            content=reply.content,
            tool_calls=calls,
            finish_reason=result.finish_reason,
            prompt_tokens=prompt_len,
            completion_tokens=len(result.token_ids),
            ill_formed=reply.ill_formed,
            stop_string=reply.stop_string,
            tool_choice_violated=reply.choice_violated,
            logprobs=self._token_text.logprobs(body, result.logprobs[: len(body)]) if req.logprobs else None,
            reasoning=reply.reasoning,
        )

    def _prompt_think(self, prompt: list[int], prompt_len: int) -> tuple[bool, bool]:
        """(opened, closed): the generation prompt ended inside a ``<think>`` block the template
        opened (DeepSeek R1, Qwen3 Thinking-2507), so the turn starts in its reasoning; or
        right after an empty block it closed (GLM-4.6 with thinking off). Read from the
        prompt's last tokens (a few, decoded: the tags may be special tokens or several
        byte-level ones); only the ``think`` parser asks."""
        if self.reasoning_parser_name != "think":
            return False, False
        tail = self.renderer.decode(prompt[max(0, prompt_len - _THINK_TAIL) : prompt_len])
        return prompt_opens_think(tail), prompt_closes_think(tail)


def _redact(sid: str) -> str:
    """Enough of a session id to recognise it in logs, not enough to use it."""
    return repr(sid[:10] + "…") if len(sid) > 12 else repr(sid)

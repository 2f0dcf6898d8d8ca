"""Running the battery through the real gateway and judging each case.

Defines ``certify`` / ``acertify``: build a gateway for the tokenizer (its template, its
end-of-turn ids, the settings certified) whose sampler writes what the template writes
(``Reference.written``), serve it in-process (the real ASGI app, over httpx), play each
case as an OpenAI-SDK agent would (send the history, append what comes back), then check
every trained turn of the recorded rows:

- its prompt equals ``apply_chat_template`` of the history the client sent, with the
  generation prompt (else ``fails``, naming the first differing token);
- its trained tokens are exactly the tokens sampled;
- what came back (content, reasoning, each tool call's name and arguments) is what the
  template wrote, so history sent back renders the same;
- a turn that starts a new row (``forks``) says why: the first token where the template's
  rendering of the history leaves the tokens the model was served.

A template that writes no tool call into history (DeepSeek R1) still serves a model that
calls tools: the sampler writes the calls in the resolved parser's format
(``core.gateway.certify.writers``). Its rows are exact when the turn after the calls starts a
new row with the template's rendering: that case forks (saying the calls are dropped), it does
not fail. Only a trained prompt that is not what the template renders fails.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from core.gateway.certify.cases import Case, battery, with_call_ids
from core.gateway.certify.reference import Reference, Unwritable, first_difference
from core.gateway.certify.report import CaseResult, Certificate
from core.gateway.certify.writers import write_calls
from core.gateway.config import GatewayConfig
from core.gateway.reasoning_switches import template_reasoning
from core.gateway.service import Gateway
from core.gateway.toolparse import MODEL_CALL_IDS
from core.samplers.scripted import ScriptedSampler
from core.types import SamplingParams

__all__ = ["acertify", "certify", "certified_settings", "template_hash", "tokenizer_hash"]

_MAX_TOKENS = 4096


def certified_settings(config: GatewayConfig | None) -> dict[str, Any]:
    """The gateway settings a certificate depends on (what changes rendering or parsing)."""
    c = config or GatewayConfig()
    return {
        "tool_parser": c.tool_parser,
        "reasoning_parser": c.reasoning_parser,
        "keep_reasoning": c.keep_reasoning,
        "chat_template_kwargs": dict(c.chat_template_kwargs),
        "history_mode": c.history_mode,
    }


def template_hash(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's chat template text ('' hashed when it has none)."""
    import hashlib

    return hashlib.sha256(str(getattr(tokenizer, "chat_template", "") or "").encode()).hexdigest()


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's vocabulary, merges and special tokens (its serialized form)."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        data = backend.to_str()
    else:
        data = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    specials = json.dumps(
        {str(k): str(getattr(v, "content", v)) for k, v in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()},
        sort_keys=True,
    )
    return hashlib.sha256((data + specials).encode()).hexdigest()


@dataclass
class _Turn:
    """What the certifier expects of one generated turn."""

    prompt: list[int]
    """``apply_chat_template`` of the history the client sent, with the generation prompt."""
    written: list[int]
    """The tokens the sampler returned."""


class _Certifier:
    """One certification: the gateway, its in-process app, the reference."""

    def __init__(self, tokenizer: Any, gw: Gateway, sampler: ScriptedSampler, reference: Reference) -> None:
        self.tok = tokenizer
        self.gw = gw
        self.sampler = sampler
        self.ref = reference
        reference.think = gw.reasoning_parser_name == "think"

    async def run(self, cases: list[Case]) -> list[CaseResult]:
        import httpx

        from core.gateway.app import build_app

        transport = httpx.ASGITransport(app=build_app(self.gw))
        async with httpx.AsyncClient(transport=transport, base_url="http://certifier", timeout=60) as client:
            return [await self.case(client, case) for case in cases]

    def _unencodable(self, case: Case) -> str | None:
        texts = [str(m.get("content") or "") for m in case.messages]
        texts += [str(m.get("reasoning_content") or "") for m in case.messages]
        texts += [json.dumps(c["function"]["arguments"], ensure_ascii=False)
                  for m in case.messages for c in m.get("tool_calls") or ()]
        lost = next((t for t in texts if not self.ref.round_trips(t)), None)
        return None if lost is None else f"the tokenizer cannot encode {lost[:40]!r} (it loses characters)"

    async def case(self, client: Any, case: Case) -> CaseResult:
        """Play ``case`` and judge its rows."""
        result = CaseResult(case.name, case.what, "holds")
        skip = self._unencodable(case)
        if case.tools and self.gw.tool_parser_name is None:
            # Gemma 3's template renders no tools: the gateway refuses requests that offer them (400).
            skip = "the template renders no tools, so the gateway has no tool parser and refuses requests offering them"
        if skip is not None:
            result.verdict, result.detail = "n/a", skip
            return result
        sid = self.gw.create_session(sampling=SamplingParams(max_tokens=_MAX_TOKENS))
        history: list[dict[str, Any]] = []
        ids: dict[str, str] = {}
        turns: list[_Turn] = []
        dropped: list[str] = []
        try:
            for at, message in enumerate(case.messages):
                if message["role"] != "assistant":
                    history.append(_sent(message, ids))
                    continue
                try:
                    calls = self._calls_to_write(history, message, case)
                    if calls:
                        dropped += [c["function"]["name"] for c in message["tool_calls"]]
                    following = case.messages[at + 1] if at + 1 < len(case.messages) else _NEXT_QUESTION
                    stop = self.ref.opener_stop(history, message, _sent(following, ids), case.tools,
                                                case.template_kwargs)
                    written = self.ref.written(history, message, case.tools, case.template_kwargs, calls=calls,
                                               stop=stop)
                    prompt = self.ref.encode(self.ref.text(history, case.tools, case.template_kwargs, generation=True))
                    _check_calls_written(self.ref.decode(written), message)
                except Unwritable as exc:
                    result.verdict, result.detail = "n/a", str(exc)
                    break
                except Exception as exc:  # the template's own raise_exception, or a type it cannot take
                    result.verdict = "n/a"
                    result.detail = f"the template refuses this conversation: {type(exc).__name__}: {exc}"
                    break
                self.sampler.push(written, session_id=sid)
                body: dict[str, Any] = {"model": self.gw.model_id, "messages": history}
                if case.tools:
                    body["tools"] = list(case.tools)
                if case.template_kwargs:
                    body["chat_template_kwargs"] = case.template_kwargs
                response = await client.post(
                    "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {sid}"}
                )
                turn = len(turns) + 1
                if response.status_code != 200:
                    error = response.json().get("error", {}).get("message", response.text)
                    result.problems.append(f"turn {turn}: the gateway answered {response.status_code}: {error}")
                    break
                back = response.json()["choices"][0]["message"]
                result.problems += self._round_trip(turn, message, back)
                for want, got in zip(message.get("tool_calls") or (), back.get("tool_calls") or (), strict=False):
                    ids[want["id"]] = got["id"]
                if not case.echo_reasoning:
                    back.pop("reasoning_content", None)
                history.append(back)
                turns.append(_Turn(prompt, written))
        finally:
            rows = self.gw.finish_session(sid)
            self.gw.drop_session(sid)
        if result.verdict != "n/a":
            self._judge(result, rows, turns)
            if dropped and result.verdict == "forks":
                result.detail = (f"the template writes no tool call in history (drops {dropped}), so the turn "
                                 f"after the calls starts a new row, the template's rendering; {result.detail}")
        return result

    def _calls_to_write(self, history: list[dict[str, Any]], message: dict[str, Any], case: Case) -> str:
        """The message's tool calls as the model writes them when the template writes none into
        history (else '': the template's own text has them).

        Raises:
            Unwritable: the certifier has no writer for the resolved parser's format.
        """
        if not message.get("tool_calls") or self.ref.writes_calls(history, message, case.tools, case.template_kwargs):
            return ""
        text = write_calls(self.gw.tool_parser_name, message)
        if text is None:
            raise Unwritable(f"the template writes no tool call in history and the certifier cannot write "
                             f"the {self.gw.tool_parser_name!r} parser's format")
        return text

    def _round_trip(self, turn: int, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
        """What came back differs from what the template wrote."""
        problems = []
        if (got.get("content") or "") != (want.get("content") or ""):
            problems.append(f"turn {turn}: content came back as {got.get('content')!r}, "
                            f"the template wrote {want.get('content')!r}")
        if self.gw.reasoning_parser_name is not None and (got.get("reasoning_content") or "") != (
            want.get("reasoning_content") or ""
        ):
            problems.append(f"turn {turn}: reasoning came back as {got.get('reasoning_content')!r}, "
                            f"the template wrote {want.get('reasoning_content')!r}")
        wanted = [(c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls") or ()]
        came = []
        for call in got.get("tool_calls") or ():
            try:
                came.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
            except ValueError:
                came.append((call["function"]["name"], call["function"]["arguments"]))
        if came != wanted:
            problems.append(f"turn {turn}: the tool calls the template writes parse back as {came!r}, "
                            f"not {wanted!r} (gateway.tool_parser resolved to {self.gw.tool_parser_name!r})")
        return problems

    def _judge(self, result: CaseResult, rows: list[Any], turns: list[_Turn]) -> None:
        """Check each trained turn of ``rows`` against ``turns``; set the verdict."""
        decode = self.ref.decode
        trained = [(r, row, span) for r, row in enumerate(rows) for span in row.turns if row.loss_mask[span.start]]
        result.rows, result.turns = len(rows), len(turns)
        if len(trained) != len(turns):
            result.problems.append(f"the rows train {len(trained)} turns; the model generated {len(turns)}")
        for row in rows:
            spans = {i for _, r, s in trained if r is row for i in range(s.start, s.end)}
            marked = {i for i, m in enumerate(row.loss_mask) if m}
            if spans != marked:
                result.problems.append(f"row {row.row_index}: the loss mask covers tokens outside the generated turns")
        for k, ((r, row, span), want) in enumerate(zip(trained, turns, strict=False), start=1):
            prompt, written = row.token_ids[: span.start], row.token_ids[span.start : span.end]
            if written != want.written:
                diff = first_difference(written, want.written, decode)
                result.diff = result.diff or diff
                result.problems.append(f"turn {k}: trained tokens are not the sampled ones: "
                                       f"{diff.describe('trace', 'sampled') if diff else ''}")
            diff = first_difference(prompt, want.prompt, decode)
            if diff is not None:
                result.diff = result.diff or diff
                result.problems.append(f"turn {k}: the trained prompt is not apply_chat_template's: {diff.describe()}")
            if k > 1 and r != trained[k - 2][0]:
                _, before, last = trained[k - 2]
                served = before.token_ids[: last.end]
                why = first_difference(served, want.prompt, decode)
                if why is None or why.index >= len(served):
                    reason = "the gateway rendered the whole history (it could not render only the new messages)"
                else:
                    reason = ("the template renders the history differently from the tokens served: "
                              + why.describe("served", "template"))
                result.forks.append(f"turn {k} starts row {r}: {reason}")
        if result.problems:
            # The first token difference says most; a content mismatch alone leads otherwise.
            first = next((p for p in result.problems if "token " in p), result.problems[0])
            result.verdict, result.detail = "fails", first
        elif result.forks:
            result.verdict, result.detail = "forks", result.forks[0]
        else:
            result.detail = "one row, every prompt apply_chat_template's rendering"


_NEXT_QUESTION = {"role": "user", "content": "Next question."}
"""What follows a case's last answer (a model trained on a template that opens the next message
with its stop token, GLM's ``<|user|>``, ends an answer on it)."""


def _check_calls_written(text: str, message: dict[str, Any]) -> None:
    """Raise ``Unwritable`` when the template writes some but not all of the message's calls
    (gpt-oss renders one call per message: its model calls one tool per turn). A template
    that writes none is a failure the round trip reports: it drops the model's calls."""
    names = [c["function"]["name"] for c in message.get("tool_calls") or ()]
    written = sum(1 for name in names if name in text)
    if 0 < written < len(names):
        raise Unwritable(f"the template writes {written} of the {len(names)} calls of one message "
                         "(its model makes one call per turn)")


def _sent(message: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """A scripted user/system/tool message as the client sends it (tool results answer the
    ids the gateway returned)."""
    out = dict(message)
    if "tool_call_id" in out:
        out["tool_call_id"] = ids.get(out["tool_call_id"], out["tool_call_id"])
    return out


def _closer(ref: Reference) -> str:
    """What the template writes after an assistant answer (the anchor's content) in history."""
    marker = "tracerl certifier answer"
    text = ref.text([{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], (), {},
                    generation=False)
    at = text.rfind(marker)
    return text[at + len(marker) :] if at >= 0 else ""


async def acertify(
    tokenizer: Any, *, config: GatewayConfig | None = None, generation_config: Any = None,
    end_of_turn_ids: tuple[int, ...] = (),
) -> Certificate:
    """Certify ``tokenizer``'s chat template under the gateway settings of ``config``.

    Args:
        tokenizer: The model's Hugging Face tokenizer, chat template included.
        config: The gateway settings to certify (parsers, template variables, history mode).
        generation_config: The model's generation config (its ``eos_token_id`` list), as ``Gateway`` takes it.
        end_of_turn_ids: More ids the model's sampler stops on (``Gateway.end_of_turn_ids``).

    Raises:
        ConfigError: the gateway refuses the tokenizer (no template, unknown parser).
    """
    settings = certified_settings(config)
    own = GatewayConfig(max_context_tokens=0, **settings)
    sampler = ScriptedSampler(tokenizer=tokenizer, record_calls=False)
    sampler.end_of_turn_ids = tuple(end_of_turn_ids)  # type: ignore[attr-defined]
    gw = Gateway(tokenizer=tokenizer, sampler=sampler, config=own, model_id="certifier",
                 generation_config=generation_config)
    ends = gw.end_of_turn_ids
    reference = Reference(tokenizer, own.chat_template_kwargs, ends)
    switches = template_reasoning(gw.renderer.template or "")
    cases = battery(reasoning=gw.reasoning_parser_name is not None, switch=switches.switch)
    form = MODEL_CALL_IDS.get(gw.tool_parser_name or "")
    if form is not None:  # the model writes each call's id (Kimi K2): the cases use its form
        cases = [with_call_ids(case, form) for case in cases]
    results = await _Certifier(tokenizer, gw, sampler, reference).run(cases) if ends else []
    closer = _closer(reference)
    closer_ids = reference.encode(closer)
    return Certificate(
        template_sha256=template_hash(tokenizer),
        tokenizer_sha256=tokenizer_hash(tokenizer),
        settings={**settings, "tool_parser_resolved": gw.tool_parser_name,
                  "reasoning_parser_resolved": gw.reasoning_parser_name},
        end_of_turn=[{"id": i, "text": reference.decode([i])} for i in ends],
        closer=closer,
        closer_stops=bool(closer_ids) and closer_ids[0] in ends,
        cases=results,
    )


def certify(
    tokenizer: Any, *, config: GatewayConfig | None = None, generation_config: Any = None,
    end_of_turn_ids: tuple[int, ...] = (),
) -> Certificate:
    """``acertify`` from synchronous code (runs its own event loop)."""
    return asyncio.run(acertify(tokenizer, config=config, generation_config=generation_config,
                                end_of_turn_ids=end_of_turn_ids))

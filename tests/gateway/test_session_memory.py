"""What a session keeps: stored Responses compactly, released when the session is finished or
dropped; and the logprob text conversion, cached per token id (it runs on the event loop)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import openai
import pytest

from core.gateway import GatewayConfig
from core.gateway.responses_api import StoredResponse
from core.gateway.tokentext import TokenLogprob, TokenText
from core.types import SamplingParams
from tests.gateway.conftest import Harness

LOGPROBS: Any = ["message.output_text.logprobs"]


def _all_dicts_with(obj: Any, key: str) -> int:
    """How many dicts under ``obj`` have ``key`` (a walk of the stored JSON)."""
    if isinstance(obj, dict):
        return (key in obj) + sum(_all_dicts_with(v, key) for v in obj.values())
    if isinstance(obj, list):
        return sum(_all_dicts_with(v, key) for v in obj)
    return 0


def test_stored_responses_keep_logprobs_compactly_and_return_them_whole(make_harness: Any) -> None:
    h: Harness = make_harness(config=GatewayConfig(tool_parser="none"))
    text = "A longer answer, with logprobs for every token. " * 8
    h.sampler.default = h.reply(text)
    sid = h.session(sampling=SamplingParams(max_tokens=1024))
    client = h.openai(sid)
    resp = client.responses.create(model="tiny", input="hi", include=LOGPROBS)
    sent = resp.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert len(sent) == len(h.reply(text)) - 1
    stored: StoredResponse = h.gw.session(sid).responses[resp.id]
    # No per-token dict is kept: not in the response object, not in the conversation groups.
    assert _all_dicts_with(stored.response, "logprob") == 0 and _all_dicts_with(stored.groups, "logprob") == 0
    assert stored.logprobs is not None and all(type(e) is TokenLogprob for e in stored.logprobs)
    # GET returns what the client got.
    again = client.responses.retrieve(resp.id).output[0].content[0].logprobs  # type: ignore[union-attr]
    assert [(e.token, e.logprob, e.bytes) for e in again] == [(e.token, e.logprob, e.bytes) for e in sent]
    # A continuation renders the stored conversation (logprobs are not part of it).
    h.sampler.default = h.reply("ok")
    follow = client.responses.create(model="tiny", input="more", previous_response_id=resp.id)
    assert follow.output_text == "ok"
    rows = h.call(h.gw.finish_session, sid)
    assert len(rows) == 1 and rows[0].metadata["forks"] == 0


def test_stored_response_memory_is_a_fraction_of_the_dicts(make_harness: Any) -> None:
    """Measured: what one stored response with logprobs adds to the session's memory, against
    keeping the per-token dicts (the old behaviour: the response object as returned). Measured
    2026-11-30: 1,024 tokens, 66 kB kept against 256 kB as dicts; printed with ``-s``."""
    h: Harness = make_harness(config=GatewayConfig(tool_parser="none"))
    text = "token " * 300
    h.sampler.default = h.reply(text)
    sid = h.session(sampling=SamplingParams(max_tokens=1024))
    client = h.openai(sid)
    client.responses.create(model="tiny", input="warm", include=LOGPROBS)  # fills the token cache
    stored: StoredResponse = h.call(lambda: next(reversed(h.gw.session(sid).responses.values())))
    full = stored.full()

    def size(make: Any) -> int:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del kept
        return used

    import copy

    as_dicts = size(lambda: copy.deepcopy(full["output"]))
    # The TokenLogprob objects are made anew; their strings and byte lists are the cache's.
    compact = size(lambda: (copy.deepcopy(stored.response["output"]),
                            [TokenLogprob(e.token, e.logprob, e.bytes) for e in stored.logprobs or ()]))
    # The figure docs/gateway.md quotes (benchmarks/figures.py --only stored_response_memory reads it).
    print(f"\nstored response memory: {len(stored.logprobs or ())} tokens, "
          f"{compact / 1000:.0f} kB kept, {as_dicts / 1000:.0f} kB as dicts")
    assert compact * 3 < as_dicts, (compact, as_dicts)


def test_finished_or_dropped_sessions_release_their_stored_responses(harness: Harness) -> None:
    h = harness
    h.sampler.default = h.reply("ok")
    finished, dropped = h.session(), h.session()
    for sid in (finished, dropped):
        h.openai(sid).responses.create(model="tiny", input="hi")
        assert len(h.gw.session(sid).responses) == 1
    kept = h.gw.session(dropped)
    rows = h.call(h.gw.finish_session, finished)
    assert rows and h.gw.session(finished).responses == {} and h.gw.session(finished).matched is None
    h.call(h.gw.drop_session, dropped)
    assert kept.responses == {}  # a request still holding the session object keeps nothing either
    with pytest.raises(openai.ConflictError):
        h.openai(finished).responses.create(model="tiny", input="hi")


def test_logprob_text_is_cached_per_token_id(byte_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    text = TokenText(byte_tokenizer)
    ids = byte_tokenizer.encode("héllo wörld, " * 200, add_special_tokens=False)
    first = text.logprobs(ids, [-1.0] * len(ids))
    calls = 0
    real = byte_tokenizer.convert_ids_to_tokens

    def counting(*a: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*a, **kw)

    monkeypatch.setattr(byte_tokenizer, "convert_ids_to_tokens", counting)
    second = text.logprobs(ids, [-1.0] * len(ids))
    monkeypatch.undo()
    assert calls == 0 and second == first  # every id came from the cache (the uncached path calls the tokenizer per id)
    assert b"".join(bytes(e.bytes) for e in second).decode() == "héllo wörld, " * 200
    text.CACHE_IDS = 3
    small = text.logprobs(ids[:50], [0.0] * 50)
    assert [e.token for e in small] == [e.token for e in first[:50]]  # cleared and refilled, still right

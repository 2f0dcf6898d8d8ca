"""Trainer-side rewards: the built-in match and math checkers, the LLM judge against a
scripted OpenAI-compatible endpoint (a fake at the network edge: no judge model is
reachable here), a third-party reward plugin, and the judge and late rewards inside
the training loop (fake backend, real gateway, real agent processes)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError
from core.plugins import RewardRegistry, RewardSpec, hookimpl, load_plugins
from core.rewards import RewardConfig, RewardInput, RewardOutput, RewardStage, build_reward_stage
from core.rewards.builtin import MatchReward, MatchRewardConfig, MathReward, MathRewardConfig
from core.rewards.judge import JudgeReward, JudgeRewardConfig
from core.rollout import RolloutOutcome
from core.rundir.metrics import read_metrics
from core.testing.fakes import CREATED, compose, fake_backend_plugin
from core.trainer.loop import Trainer
from core.types import RolloutRequest, RolloutResult, RolloutStatus, TraceRecord
from tests.eval.scripted_openai import ScriptedOpenAI

HERE = Path(__file__).parent
EVAL_AGENTS = HERE.parent / "eval"  # eval_agents.py, the agents tests/eval shares


def _outcome(answer: str, payload: dict[str, Any], group: str = "g0", status: RolloutStatus = RolloutStatus.OK) -> RolloutOutcome:
    rid = f"r{abs(hash((answer, group, json.dumps(payload)))) % 10**8}"
    row = TraceRecord(session_id="s", token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0], prompt_length=1)
    return RolloutOutcome(
        request=RolloutRequest(rid, group, payload, "http://x/v1", "s", "m"),
        result=RolloutResult(rid, status, reward=0.25 if status is RolloutStatus.OK else None),
        rows=[row],
        faults={"model_turns": 1},
        conversation=[
            {"parent": -1, "messages": [{"role": "user", "content": f"Solve {payload.get('q', '')}"}], "turn": None},
            {"parent": 0, "messages": [{"role": "assistant", "content": answer}], "turn": 0},
        ],
    )


def _stage(*overrides: str, plugins: Any = None) -> RewardStage:
    """The stage ``python -m core.train`` builds for these overrides (composed by Hydra)."""
    plugins = plugins or load_plugins()
    return build_reward_stage(compose(["run_dir=unused", *overrides], plugins), plugins)


def _direct(config: Any, **settings: Any) -> RewardStage:
    """The stage for a built-in reward built from its config dataclass (no Hydra: cheaper)."""
    node = OmegaConf.structured(replace(config, **settings))
    factory = {"match": MatchReward, "math": MathReward, "judge": JudgeReward}[node.name]
    return RewardStage(factory(node), name=node.name, mode=node.mode, component=node.component)


def test_match_and_math_rewards_score_the_final_answer() -> None:
    exact = _stage("reward=match")  # chosen through the Hydra group
    out = asyncio.run(exact.score([_outcome(" 7 ", {"answer": "7"}), _outcome("8", {"answer": "7"})]))
    assert [o.result.reward for o in out] == [1.0, 0.0]
    assert out[0].rows[0].reward == 1.0 and out[0].result.metrics["reward/match"] == 1.0
    regex = _direct(MatchRewardConfig(), pattern=r"Answer: (\d+)", mode="add")
    out = asyncio.run(regex.score([_outcome("so... Answer: 42", {"answer": "42"}), _outcome("42", {"answer": "42"})]))
    assert [o.result.reward for o in out] == [1.25, 0.25]  # the agent's 0.25 plus the match
    math = _direct(MathRewardConfig())
    out = asyncio.run(
        math.score(
            [
                _outcome("The answer is $\\frac{1}{2}$", {"answer": "0.5"}),
                _outcome("\\boxed{3}", {"answer": "4"}),
                _outcome("2", {"question": "no answer field"}),
            ]
        )
    )
    assert [o.result.status for o in out[:2]] == [RolloutStatus.OK, RolloutStatus.OK]
    assert [o.result.reward for o in out[:2]] == [1.0, 0.0]
    assert out[2].result.status is RolloutStatus.JUDGE_ERROR and "no 'answer'" in str(out[2].result.error)
    assert out[2].rows[0].status is RolloutStatus.JUDGE_ERROR and out[2].rows[0].reward is None
    # mode=replace: an agent that returns no reward at all is scored, if its model calls were clean.
    silent = _outcome("7", {"answer": "7"}, status=RolloutStatus.NO_REWARD)
    broken = _outcome("7", {"answer": "7"}, group="g1", status=RolloutStatus.NO_REWARD)
    broken.faults["sampler_errors"] = 1
    out = asyncio.run(exact.score([silent, broken]))
    assert out[0].result.status is RolloutStatus.OK and out[0].result.reward == 1.0
    assert out[1].result.status is RolloutStatus.NO_REWARD  # a broken call: not scored
    add = asyncio.run(_direct(MatchRewardConfig(), mode="add").score([silent]))
    assert add[0].result.status is RolloutStatus.NO_REWARD  # add needs the agent's reward
    with pytest.raises(ConfigError, match="not a valid regex"):
        _direct(MatchRewardConfig(), pattern="(")


def test_third_party_reward_plugin_registers_and_is_chosen_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process (``load_plugins(extra_plugins=...)``); a reward plugin pip-installed into a
    throwaway venv is tests/plugins/test_third_party.py::test_third_party_reward_plugin_is_listed_and_scores."""
    from dataclasses import dataclass

    @dataclass
    class LengthConfig(RewardConfig):
        name: str = "length"
        per_char: float = 0.1

    class Length:
        def __init__(self, cfg: Any) -> None:
            self.per_char = float(cfg.reward.per_char)

        async def score(self, group: list[RewardInput]) -> list[RewardOutput]:
            return [
                RewardOutput(reward=len(i.final_answer) * self.per_char, components={"chars": float(len(i.final_answer))})
                for i in group
            ]

    @hookimpl
    def tracerl_register_rewards(registry: RewardRegistry) -> None:
        registry.add(RewardSpec("length", Length, LengthConfig, "answer length"))

    module = ModuleType("my_rewards")
    module.tracerl_register_rewards = tracerl_register_rewards  # type: ignore[attr-defined]
    # ... and docs/plugins.md's example plugin, executed as written.
    doc = (HERE.parents[1] / "docs" / "plugins.md").read_text()
    source = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if b.startswith("# tracerl_myreward/plugin.py"))
    documented = ModuleType("tracerl_myreward_plugin")
    monkeypatch.setitem(sys.modules, documented.__name__, documented)  # dataclasses look it up
    exec(compile(source, "docs/plugins.md", "exec"), documented.__dict__)
    plugins = load_plugins(extra_plugins=(module, documented))
    assert {"length", "short"} <= set(plugins.rewards.names())
    short = _stage("reward=short", "reward.max_chars=3", plugins=plugins)
    scored = asyncio.run(short.score([_outcome("abc", {}), _outcome("abcd", {})]))
    assert [o.result.reward for o in scored] == [1.0, 0.0] and scored[0].result.metrics == {"reward/short": 1.0}
    stage = _stage("reward=length", "reward.per_char=0.5", "reward.mode=log", plugins=plugins)
    out = asyncio.run(stage.score([_outcome("abcd", {})]))
    assert out[0].result.reward == 0.25  # mode=log: the agent's reward trains
    assert out[0].result.metrics == {"reward/length": 2.0, "reward/chars": 4.0, "reward/length_failed": 0.0}
    with pytest.raises(ConfigError, match=r"unknown key reward\.per_chr.*Did you mean reward\.per_char"):
        _stage("reward=length", "+reward.per_chr=1", plugins=plugins)
    with pytest.raises(ConfigError, match="unknown reward 'nope'.*Installed rewards: agent, judge, length, match, math, short"):
        plugins.reward("nope")


def _judge_scores(body: dict[str, Any]) -> str:
    """Scores each trajectory by the digit it answered: digit / 9 (so the ranking is known)."""
    user = body["messages"][-1]["content"]
    found = re.findall(r'<trajectory-[0-9a-f]+ id="(t\d+)">.*?assistant: (\S*)\s*</trajectory-[0-9a-f]+>', user, re.S)
    scores = [{"id": tid, "score": (int(a) / 9 if a.isdigit() else 0.0), "why": "digit"} for tid, a in found]
    return "Here you go:\n" + json.dumps({"scores": scores})


def test_judge_retries_caches_and_reports_failures(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky(body: dict[str, Any]) -> str | tuple[int, str]:
        calls["n"] += 1
        if calls["n"] == 1:
            return (503, "overloaded")
        if calls["n"] == 2:
            return "I think t1 is best."  # no JSON
        return _judge_scores(body)

    group = [_outcome("3", {"q": 1}), _outcome("9", {"q": 1}), _outcome("0", {"q": 1})]
    with ScriptedOpenAI(flaky) as server:
        settings = {
            "endpoint": server.base_url, "model": "judge-1", "retry_backoff_s": 0.01,
            "cache_path": str(tmp_path / "cache.jsonl"),
        }
        out = asyncio.run(_direct(JudgeRewardConfig(), **settings).score(group))
        assert [o.result.reward for o in out] == pytest.approx([3 / 9, 1.0, 0.0])
        assert calls["n"] == 3 and len(server.requests) == 3
        assert server.requests[-1]["model"] == "judge-1" and "Rubric:" in server.requests[-1]["messages"][0]["content"]
        # The same group again: answered from the cache (a new stage reads the cache file).
        again = asyncio.run(_direct(JudgeRewardConfig(), **settings).score(group))
        assert [o.result.reward for o in again] == [o.result.reward for o in out] and calls["n"] == 3
    with ScriptedOpenAI(lambda body: '{"scores": [{"id": "t1", "score": 7}]}') as bad:
        stage = _direct(
            JudgeRewardConfig(), endpoint=bad.base_url, model="j", max_retries=2, retry_backoff_s=0.01
        )
        out = asyncio.run(stage.score(group))
        assert len(bad.requests) == 3  # one try and two retries
    assert {o.result.status for o in out} == {RolloutStatus.JUDGE_ERROR}
    assert all(o.result.reward is None for o in out)
    assert "failed 3 times" in str(out[0].result.error) and "outside [0, 1]" in str(out[0].result.error)
    assert isinstance(stage.function, JudgeReward)
    # One by one (relative=false): one request per rollout, at most `concurrency` at once.
    with ScriptedOpenAI(_judge_scores, delay_s=0.1) as slow:
        stage = _direct(JudgeRewardConfig(), endpoint=slow.base_url, model="j", relative=False, concurrency=2)
        out = asyncio.run(stage.score([*group, _outcome("6", {"q": 1})]))
        assert len(slow.requests) == 4 and slow.max_in_flight == 2
        assert all(b["messages"][-1]["content"].count("<trajectory") == 1 for b in slow.requests)
    assert [o.result.reward for o in out] == pytest.approx([3 / 9, 1.0, 0.0, 6 / 9])


def test_judge_cache_keeps_only_the_most_recently_used_replies(tmp_path: Path) -> None:
    """The judge's cache is an LRU of ``reward.cache_size`` replies (it grew without bound),
    and its cache file is cut back to them once it holds more than twice as many."""
    outcomes = [_outcome(str(d), {"q": q}, group=f"g{q}") for q, d in enumerate([1, 2, 3, 4])]
    cache = tmp_path / "cache.jsonl"

    async def ask(judge: JudgeReward, *which: int) -> None:
        for q in which:
            o = outcomes[q]
            await judge.score([RewardInput("r", o.request.group_id, o.request.payload, o.result, o.rows, o.conversation)])
        await judge.aclose()

    with ScriptedOpenAI(_judge_scores) as server:
        config = OmegaConf.structured(
            JudgeRewardConfig(endpoint=server.base_url, model="j", cache_size=2, cache_path=str(cache))
        )
        judge = JudgeReward(config)
        asyncio.run(ask(judge, 0, 1, 0, 2))  # g0 used again after g1: g1 is dropped for g2
        assert judge.requests == 3 and len(judge._cache) == 2
        asyncio.run(ask(judge, 0, 2))
        assert judge.requests == 3  # both still cached
        asyncio.run(ask(judge, 1))
        assert judge.requests == 4  # g1 was evicted, so it is asked again
        asyncio.run(ask(judge, 3))
        assert len(cache.read_text().splitlines()) == 5  # appended: more than twice cache_size
        reloaded = JudgeReward(config)
        assert len(reloaded._cache) == 2 and len(cache.read_text().splitlines()) == 2
        asyncio.run(ask(reloaded, 3, 1))
        assert reloaded.requests == 0  # the two newest replies survived the rewrite
    with pytest.raises(ConfigError, match="reward.cache_size must be an integer >= 0"):
        JudgeReward(OmegaConf.structured(JudgeRewardConfig(endpoint="http://x/v1", model="j", cache_size=-1)))


def _loop_cfg(tmp_path: Path, *extra: str, agent: str = "core.tasks.succ_digit:app") -> tuple[Any, Any]:
    plugins = load_plugins(extra_plugins=(fake_backend_plugin(),))
    cfg = compose(
        [
            "backend=fake", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=1", "trainer.batch_size=2",
            "trainer.group_size=4", "trainer.progress=false", "trainer.loggers=[jsonl]",
            "runtime.num_processes=1", f"task.agent={agent}", f"+task.agent_env.PYTHONPATH={EVAL_AGENTS}",
            "task.generator_kwargs.rows=40", *extra,
        ],
        plugins,
    )
    return cfg, plugins


@pytest.mark.integration
def test_group_judge_ranking_drives_the_advantages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    original = Trainer._signal

    def spy(self: Trainer, outcomes: list[RolloutOutcome]) -> Any:
        signal = original(self, outcomes)
        seen.append((outcomes, signal))
        return signal

    monkeypatch.setattr(Trainer, "_signal", spy)
    with ScriptedOpenAI(_judge_scores) as judge:
        cfg, plugins = _loop_cfg(
            tmp_path, "reward=judge", f"reward.endpoint={judge.base_url}", "reward.model=judge-1",
            "trainer.eval_every=0", "trainer.eval_size=0", "trainer.canary=false",
        )
        CREATED.clear()
        assert asyncio.run(Trainer(cfg, plugins).run()) == 0
        assert len(judge.requests) >= 2  # one request per group (RULER-style)
    (outcomes, signal), = seen
    by_group: dict[str, list[RolloutOutcome]] = {}
    for o in outcomes:
        assert o.ok, o.result.error
        digit = o.conversation[-1]["messages"][-1]["content"]
        assert o.result.reward == pytest.approx(int(digit) / 9)  # the judge's score, not the agent's
        by_group.setdefault(o.request.group_id, []).append(o)
    for group in by_group.values():
        rewards = [o.result.reward for o in group]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        for o in group:
            expected = 0.0 if std == 0 else (o.result.reward - mean) / (std + 1e-4)  # core.algo's eps
            assert signal.advantages[o.request.rollout_id] == pytest.approx(expected, abs=1e-4)
    # ... and those advantages are what the backend trained on.
    sent = sorted({round(a, 6) for d in CREATED[-1].datums_seen[0] for a, w in zip(d.advantages, d.weights, strict=True) if w})
    assert sent == sorted({round(a, 6) for a in signal.advantages.values()})
    record = next(r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("step") == 1 and "reward/mean" in r)
    assert record["rollouts/judge_error"] == 0
    assert record["reward/judge"] == pytest.approx(record["reward/mean"])


@pytest.mark.integration
def test_late_rewards_are_awaited_and_timeouts_counted(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"payload": {"n": n, "answer": str(n + 1)}}) + "\n" for n in (2, 3)))
    cfg, plugins = _loop_cfg(
        tmp_path, f"task.train_path={data}", "task.eval_path=''", "trainer.canary=false",
        "trainer.eval_every=0", "trainer.eval_size=0", "trainer.max_failure_rate=1.0", "reward.timeout_s=2",
        "gateway.admin_token=s3cret", "+task.agent_env.TEST_ADMIN_TOKEN=s3cret", agent="eval_agents:late",
    )
    trainer = Trainer(cfg, plugins)
    assert asyncio.run(trainer.run()) == 0
    record = next(r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("step") == 1 and "reward/mean" in r)
    assert record["rollouts/ok"] == 4 and record["rollouts/reward_timeout"] == 4  # n=2 posted, n=3 never
    assert record["reward/mean"] == pytest.approx(0.2)
    assert record["rollouts/reward_pending"] == 0  # never left pending after the wait
    # Posting after the wait ended, or for an unknown id, is refused with a reason.
    late = trainer.gateway.late_rewards
    with pytest.raises(ConfigError, match="no running or pending rollout"):
        late.post("nope", 1.0)
    with pytest.raises(ConfigError, match="finite number"):
        late.post("nope", float("nan"))


def test_backends_with_their_own_trainer_refuse_a_trainer_side_reward() -> None:
    """verl and slime train on the agent's reward: reward=<name> would be silently ignored."""
    from core.train import check_driving_settings

    plugins = load_plugins()
    with pytest.raises(ConfigError, match="reward=match scores rollouts in core's loop.*'verl'"):
        check_driving_settings(compose(["run_dir=unused", "reward=match"], plugins), "verl")
    check_driving_settings(compose(["run_dir=unused"], plugins), "verl")  # reward=agent passes


class _Fixed:
    """A reward function returning the given outputs, one per rollout."""

    def __init__(self, *outputs: RewardOutput) -> None:
        self.outputs = outputs

    async def score(self, group: Any) -> list[RewardOutput]:
        return list(self.outputs[: len(group)])


def test_a_non_numeric_score_or_component_is_judge_error_not_a_crash() -> None:
    """A plugin's string score, NaN component or bool is ``judge_error`` with a reason;
    it used to raise out of ``RewardStage.score`` and end the training step."""
    payload = {"q": "1+1", "answer": "2"}
    group = [_outcome(a, payload) for a in ("2", "3", "4", "5")]
    stage = RewardStage(
        _Fixed(
            RewardOutput(reward="high"),  # type: ignore[arg-type]
            RewardOutput(reward=1.0, components={"style": "good"}),  # type: ignore[dict-item]
            RewardOutput(reward=1.0, components={"style": float("nan")}),
            RewardOutput(reward=0.5, components={"style": 1}),
        ),
        name="fixed",
    )
    out = asyncio.run(stage.score(group))
    assert [o.result.status for o in out] == [RolloutStatus.JUDGE_ERROR] * 3 + [RolloutStatus.OK]
    assert "'high'" in (out[0].result.error or "") and "'style'" in (out[1].result.error or "")
    assert out[3].result.reward == 0.5 and out[3].result.metrics["reward/style"] == 1.0
    assert all(r.reward is None for o in out[:3] for r in o.rows)


def test_log_mode_keeps_the_agents_reward_when_the_judge_fails() -> None:
    """``reward.mode=log``: the agent's reward trains, the plugin's score is only
    logged, so a failing plugin must not exclude the rollout (it used to become
    ``judge_error``: a judge outage excluded every rollout and aborted the run)."""
    payload = {"q": "1+1", "answer": "2"}
    group = [_outcome(a, payload) for a in ("2", "3")]
    stage = RewardStage(
        _Fixed(RewardOutput(error="judge down"), RewardOutput(reward=0.9)), name="fixed", mode="log"
    )
    out = asyncio.run(stage.score(group))
    assert [o.result.status for o in out] == [RolloutStatus.OK, RolloutStatus.OK]
    assert [o.result.reward for o in out] == [0.25, 0.25]  # the agent's, as before scoring
    assert all(r.reward == 0.25 for o in out for r in o.rows)
    assert "reward/fixed" not in out[0].result.metrics and out[1].result.metrics["reward/fixed"] == 0.9
    assert [o.result.metrics["reward/fixed_failed"] for o in out] == [1.0, 0.0]
    # Every other mode still excludes what it cannot score.
    for mode in ("replace", "add"):
        scored = asyncio.run(RewardStage(_Fixed(RewardOutput(error="judge down")), name="f", mode=mode).score(group[:1]))
        assert scored[0].result.status is RolloutStatus.JUDGE_ERROR


def test_a_plugin_score_past_max_abs_reward_is_invalid_reward() -> None:
    """The bound the agent's own reward meets applies to a plugin's score too: a 1e12
    would otherwise swamp every advantage of its group (it trained as given before)."""
    payload = {"q": "1+1", "answer": "2"}
    group = [_outcome(a, payload) for a in ("2", "3", "4")]
    stage = RewardStage(
        _Fixed(RewardOutput(reward=1e12), RewardOutput(reward=-5.0), RewardOutput(reward=1.0)),
        name="fixed", max_abs_reward=2.0,
    )
    out = asyncio.run(stage.score(group))
    assert [o.result.status for o in out] == [RolloutStatus.INVALID_REWARD] * 2 + [RolloutStatus.OK]
    assert "trainer.max_abs_reward=2" in (out[0].result.error or "")
    assert all(r.reward is None for o in out[:2] for r in o.rows)
    # add mode bounds the sum (the agent's 0.25 plus the score).
    added = asyncio.run(RewardStage(_Fixed(RewardOutput(reward=1.9)), name="f", mode="add",
                                    max_abs_reward=2.0).score(group[:1]))
    assert added[0].result.status is RolloutStatus.INVALID_REWARD

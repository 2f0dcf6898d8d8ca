"""What ``python -m core.eval`` does with a composed config: build, run, write, print.

Through the gateway, an evaluation certifies the model's chat template first, as ``python -m
core.train`` does (the same cache, ``template_certificate.json`` in the output directory, refused
unless ``gateway.allow_uncertified_template``), and its summary reports each turn's tool-call
parse status (``gateway/tool_parse_failed``, ``gateway/parse/<status>``), warning as a training
step does when calls fail to parse or none is made.

Besides ``results.jsonl`` and ``summary.json``, an evaluation stores its rollouts
as the training loop stores an evaluation (``traces/``), so ``python -m core.view
OUTPUT_DIR`` shows every rollout's status, reward and error, and through the
gateway its conversation and tokens too.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core.errors import ConfigError
from core.eval.results import summarize, write_rows
from core.eval.run import EndpointRunner, run_eval
from core.http import check_key_endpoint
from core.plugins.policy_backend import check_policy_tokenizers, policy_backend_config
from core.types import PolicySampling, SamplingParams

__all__ = [
    "evaluate_config",
    "format_summary",
    "print_summary",
    "resolve_checkpoint",
    "resolve_policy_checkpoints",
]


def _checkpoint_state(path: str) -> tuple[dict[str, Any], Path]:
    """The trainer state of a checkpoint directory, or of a run's latest one, and its directory."""
    from core.rundir.checkpoint import STATE_FILE, latest_checkpoint

    where = Path(path)
    state_file = where / STATE_FILE
    if state_file.is_file():
        return json.loads(state_file.read_text()), where
    found = latest_checkpoint(where)
    if found is None:
        raise ConfigError(
            f"eval.checkpoint={path!r} is neither a checkpoint directory (with {STATE_FILE}) "
            "nor a run directory holding one; pass <run_dir> or <run_dir>/checkpoints/step_N"
        )
    return found.state, found.path


def resolve_checkpoint(path: str) -> str:
    """The backend state directory of a checkpoint directory, or of a run's latest one."""
    state, ckpt = _checkpoint_state(path)
    # The state names the path the run saved to; beside the state file is where it is now
    # (a run directory that was moved or given relative to another working directory).
    local = ckpt / "backend"
    return str(local if local.exists() else state["backend_path"])


def resolve_policy_checkpoints(path: str, policies: list[str]) -> dict[str, str]:
    """Each policy's backend state in a checkpoint of a run that trained ``policies`` (two or
    more; ``resolve_checkpoint`` for one): ``backend/<policy>`` beside the state file when
    there, else the path the run saved (a ``tinker://`` path, say).

    Raises:
        ConfigError: the checkpoint holds other policies than ``policies``.
    """
    state, ckpt = _checkpoint_state(path)
    saved = state.get("policies")
    held = sorted(saved) if isinstance(saved, dict) else None
    if held != sorted(policies):
        raise ConfigError(
            f"eval.checkpoint={path!r} holds {held or 'one policy'}, but policies configures "
            f"{sorted(policies)}; evaluate with the policies the run trained (docs/multi_agent.md)"
        )
    assert isinstance(saved, dict)
    out = {}
    for name in policies:
        local = ckpt / "backend" / name
        out[name] = str(local if local.exists() else saved[name])
    return out


def _load_eval_set(cfg: Any, out: Path) -> list[dict[str, Any]]:
    from core.rollout import load_payloads, prepare_data

    ev = cfg.eval
    if ev.data:
        rows = load_payloads(str(ev.data))
    else:
        rows = prepare_data(cfg, out)[1]
        if not rows:
            raise ConfigError(
                "the task has no eval set: set eval.data (or task.eval_path) to a JSONL or Parquet "
                "file with a 'payload' field"
            )
    limit = int(ev.limit)
    if limit < 0:
        raise ConfigError(f"eval.limit={limit} must be >= 0 (0: every row)")
    return rows[:limit] if limit else rows


def eval_sampling(cfg: Any) -> SamplingParams:
    """The sessions' sampling: ``eval.temperature``, and ``eval.max_tokens`` or, when 0, each
    policy's own ``max_tokens`` (``algorithm.max_tokens`` for a policy without one), as training
    samples them (the default policy's in the session, the others' in ``by_policy``)."""
    ev = cfg.eval
    run_max = int(cfg.algorithm.max_tokens)
    own = {str(name): int((p or {}).get("max_tokens") or run_max) for name, p in (cfg.get("policies") or {}).items()}
    base = int(ev.max_tokens) or (next(iter(own.values())) if own else run_max)
    temperature = float(ev.temperature)
    by_policy = () if int(ev.max_tokens) else tuple(
        (name, PolicySampling(temperature=temperature, top_p=1.0, top_k=-1, max_tokens=mine))
        for name, mine in own.items()
        if mine != base
    )
    return SamplingParams(
        max_tokens=base,
        temperature=temperature,
        seed=(int(cfg.seed) * 1_000_003 + 5) % (2**62),
        by_policy=by_policy,
    )


async def evaluate_config(cfg: Any, plugins: Any) -> dict[str, Any]:
    """Evaluate as ``cfg`` says; writes ``results.jsonl`` and ``summary.json``, returns the summary."""
    from core.rewards import build_reward_stage

    ev = cfg.eval
    if int(ev.concurrency) < 1:
        raise ConfigError(f"eval.concurrency={ev.concurrency} must be >= 1")
    if ev.endpoint and ev.checkpoint:
        raise ConfigError("set eval.endpoint or eval.checkpoint, not both (an endpoint serves its own model)")
    if ev.endpoint:  # before anything is written or started
        check_key_endpoint(str(ev.endpoint), setting="eval", key_env=str(ev.api_key_env),
                           has_key=bool(os.environ.get(str(ev.api_key_env))),
                           allow_plain_http=bool(ev.get("allow_plain_http", False)))
    out = Path(str(ev.output_dir or cfg.run_dir))
    out.mkdir(parents=True, exist_ok=True)
    payloads = _load_eval_set(cfg, out)
    sampling = eval_sampling(cfg)
    closers: list[Any] = []
    decode = None
    try:
        if ev.endpoint:
            runner, model = await _endpoint_runner(cfg, plugins, closers), str(ev.model)
        else:
            runner, model, decode = await _gateway_runner(cfg, plugins, closers, out)
        rewards = build_reward_stage(cfg, plugins, runner)
        closers.append(rewards.aclose)
        outcomes, rows = await run_eval(
            runner,
            payloads,
            samples_per_prompt=int(ev.samples_per_prompt),
            sampling=sampling,
            rewards=rewards,
            progress=bool(ev.progress),
        )
    finally:
        for close in reversed(closers):
            try:
                await close()
            except Exception as exc:  # keep closing the rest
                print(f"warning: shutdown step failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    summary = summarize(rows, pass_threshold=float(ev.pass_threshold))
    summary["model"] = model
    summary["checkpoint"] = str(ev.checkpoint) or None
    if decode is not None:  # through the gateway: each turn's parse status, as a training step reports them
        from core.gateway.parse_watch import ParseWatch, parse_metrics

        parsed = parse_metrics(row for o in outcomes for row in o.rows)
        summary.update(parsed)
        for line in ParseWatch().warnings({**parsed, "step": "eval"}):
            print(line, file=sys.stderr, flush=True)
    write_rows(out / "results.jsonl", rows)
    # The rollouts for python -m core.view OUTPUT_DIR. Against an endpoint there is no
    # gateway, so no rows or conversation, but status, reward, components and errors.
    from core.rundir.traces import TraceWriter

    TraceWriter(out, 1, decode).write_step(0, outcomes, {}, kind="eval")
    (out / "summary.json").write_text(json.dumps(_json_safe(summary), indent=2) + "\n")
    summary["output_dir"] = str(out)
    return summary


async def _endpoint_runner(cfg: Any, plugins: Any, closers: list[Any]) -> EndpointRunner:
    ev = cfg.eval
    if not ev.model:
        raise ConfigError("eval.endpoint needs eval.model, the model name the endpoint serves")
    runtime = plugins.runtime(str(cfg.runtime.name)).factory(cfg)
    await runtime.start()
    closers.append(runtime.aclose)
    return EndpointRunner(
        runtime=runtime,
        base_url=str(ev.endpoint),
        model_id=str(ev.model),
        api_key=os.environ.get(str(ev.api_key_env), "") or "EMPTY",
        max_concurrency=int(ev.concurrency),
        timeout_s=float(cfg.trainer.rollout_timeout_s),
        max_abs_reward=float(cfg.trainer.max_abs_reward),
    )


def _policy_routes(cfg: Any) -> Any:
    """The gateway's routing for ``cfg.policies`` (one default policy when empty)."""
    from core.gateway.policies import PolicyRoutes

    policies = cfg.get("policies") or {}
    if not policies:
        return PolicyRoutes()
    models = {str(m): str(name) for name, p in policies.items() for m in ((p or {}).get("models") or [])}
    return PolicyRoutes(names=tuple(str(name) for name in policies), models=models)


async def _gateway_runner(cfg: Any, plugins: Any, closers: list[Any], out: Path) -> tuple[Any, str, Any]:
    from core.gateway import Gateway
    from core.gateway.certify import certify_on_start
    from core.gateway.config import GatewayConfig
    from core.rollout import start_rollout_stack

    ev = cfg.eval
    spec = plugins.backend(str(cfg.backend.name))
    if spec.kind != "driven":
        raise ConfigError(
            f"backend {spec.name!r} runs its own trainer and has no sampler core can drive; "
            "evaluate its exported model through eval.endpoint (an OpenAI-compatible server) instead"
        )
    routes = _policy_routes(cfg)
    several = len(routes.names) > 1
    if several and not spec.multi_policy:
        raise ConfigError(
            f"policies configures {len(routes.names)} policies {list(routes.names)}, but backend "
            f"{spec.name!r} serves one (its BackendSpec does not declare multi_policy=True); keep at most "
            "one entry in policies (docs/multi_agent.md)"
        )
    backends: dict[str, Any] = {}
    for name in routes.names:  # a backend per policy, as the training loop builds them (its own backend settings)
        own = ((cfg.get("policies") or {}).get(name) or {}).get("backend")
        backends[name] = spec.factory(policy_backend_config(cfg, name, own, spec))
        closers.append(backends[name].aclose)
    check_policy_tokenizers(backends)
    backend = backends[routes.default]
    if ev.checkpoint:
        await _load_checkpoint(backends, str(ev.checkpoint))
    config = GatewayConfig(**OmegaConf.to_container(cfg.gateway, resolve=True))  # type: ignore[arg-type]
    gateway = Gateway(tokenizer=backend.get_tokenizer(), sampler=backend.sampler, config=config,
                      model_id=backend.model_id(), policies=routes)
    for name, other in backends.items():
        if name != routes.default:
            gateway.set_sampler(other.sampler, policy=name)
    # As python -m core.train does: an evaluation's traces are exact or it says which case is not.
    await certify_on_start(gateway.renderer.tokenizer, config, out_dir=out, end_of_turn_ids=gateway.end_of_turn_ids)
    cfg.trainer.max_concurrent_rollouts = int(ev.concurrency)
    stack = await start_rollout_stack(cfg, gateway, model_id=backend.model_id(), plugins=plugins)
    closers.append(stack.aclose)
    label = f"{backend.model_id()} @ {ev.checkpoint}" if ev.checkpoint else f"{backend.model_id()} (base)"
    if several:
        label += f" (policies {', '.join(routes.names)})"
    return stack.runner, label, gateway.renderer.decode


async def _load_checkpoint(backends: dict[str, Any], checkpoint: str) -> None:
    """Load a checkpoint into each policy's backend; a misfit says where the run's own settings are."""
    from core.errors import TracerlError
    from core.rundir.runconfig import RUN_FILE, run_dir_of

    names = list(backends)
    paths = resolve_policy_checkpoints(checkpoint, names) if len(names) > 1 else None
    if paths is None:
        state, _ = _checkpoint_state(checkpoint)
        saved = state.get("policies")
        if isinstance(saved, dict) and len(saved) > 1:
            raise ConfigError(
                f"eval.checkpoint={checkpoint!r} holds policies {sorted(saved)}, but this evaluation "
                "configures one; evaluate with the policies the run trained (docs/multi_agent.md)"
            )
        paths = {names[0]: resolve_checkpoint(checkpoint)}
    try:
        for name, backend in backends.items():
            await backend.load_state(paths[name])
    except TracerlError as exc:
        record = run_dir_of(checkpoint) / RUN_FILE
        where = (
            f"{record} holds them and python -m core.eval applies them first, so an override "
            "given here changed the model"
            if record.is_file()
            else f"the run left no {RUN_FILE} (written by runs since it was added): repeat its "
            "training overrides (the task's too: the tiny model's vocabulary comes from it)"
        )
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = " ".join(lines[:3]) + (f" ... ({len(lines) - 3} more lines)" if len(lines) > 3 else "")
        raise ConfigError(
            f"eval.checkpoint={checkpoint!r} does not load into the model configured here ({detail}). "
            f"It was trained with other settings: {where}"
        ) from exc


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a two-column table."""
    lines = []
    for key, value in summary.items():
        if key == "statuses":
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        elif isinstance(value, float):
            value = "nan" if not math.isfinite(value) else f"{value:.4f}"
        lines.append((str(key), str(value)))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def print_summary(summary: dict[str, Any]) -> None:
    print(format_summary(summary), flush=True)

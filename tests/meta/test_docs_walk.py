"""A newcomer's journey, run as written: the quickstart's and the examples' commands.

Every ``python -m core.train`` line in docs/quickstart.md and examples/README.md
must compose (unknown keys and groups fail here, cheaply, in-process). The
commands meant to run on CPU run for real, in a fresh directory for the
bring-your-own-agent section (its files are taken from the page), from the
repository root for the examples, and their output must look like what the
page shows. The quickstart's real-model command runs on the tiny model saved as a
Hugging Face directory (no real model is on disk here; marker ``long``).

docs/eval.md, docs/real_models.md and docs/samplers.md: every command of their
console blocks is listed in ``PAGE_COMMANDS`` (a new one fails until it is) as
run here (with what is substituted said beside it), composed only, or not run
(and why); ``test_page_commands_run`` runs the runnable ones in page order.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.rundir.metrics import CONSOLE_LEGEND

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
EXAMPLES = ROOT / "examples" / "README.md"
STEP_LINE = re.compile(r"^step +(\d+)  reward (\d\.\d{3})  failed (\d+)  lp-gap \S+  \d+\.\d\ds$")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    level = heading.split(" ")[0]
    rest = text[start + len(heading) :]
    end = re.search(rf"^{level} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def _train_commands(text: str) -> list[str]:
    lines = []
    for block in _blocks(text, "console") + _blocks(text, "bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            command = line.split("#")[0].strip()
            if "python -m core.train" in command:
                lines.append(command[command.index("python -m core.train") :])
    return lines


def _overrides(command: str) -> list[str]:
    return shlex.split(command)[3:]


def _env() -> dict[str, str]:
    """This checkout's ``core`` first, whatever is installed (the test may run from a worktree)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _run(command: str, cwd: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *shlex.split(command)[1:], *extra]
    return subprocess.run(
        argv, cwd=cwd, env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=300, check=False
    )


def _run_all(commands: list[tuple[str, tuple[str, ...]]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """``_run`` of each (command, extra arguments), all started at once: they are independent
    processes, and a machine's second core would otherwise wait on each one's imports."""
    procs = [
        subprocess.Popen([sys.executable, *shlex.split(command)[1:], *extra], cwd=cwd, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command, extra in commands
    ]
    try:
        done = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@functools.cache
def _plugins() -> Any:
    """The installed plugins, loaded once for the module's composes (loading reads every
    installed distribution's metadata: most of a compose's time when done per command)."""
    from core.plugins import load_plugins

    return load_plugins()


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from core.config import CONFIG_MODULE, PRIMARY_CONFIG, VERSION_BASE, register_configs

    register_configs(_plugins())
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=VERSION_BASE):
        return compose(config_name=PRIMARY_CONFIG, overrides=overrides)


def _check_shown_lines(stdout: str, shown: str) -> None:
    """Every line the page shows, other than the timed step lines, is printed (paths, times and
    ``<placeholders>`` as wildcards)."""
    for line in shown.strip().splitlines():
        if STEP_LINE.match(line):
            continue
        pattern = re.escape(line).replace(re.escape("outputs/<date>/<time>"), r"\S+")
        pattern = re.sub(r"\d+\\\.\d+s", r"\\d+\\.\\d+s", pattern)  # times vary (`in 3.3s`)
        pattern = re.sub(r"<\w+>", r"\\S+", pattern)  # a placeholder: `task=<task>`
        assert re.search(rf"^{pattern}$", stdout, re.MULTILINE), (line, stdout)


def _check_step_lines(stdout: str, steps: int) -> list[re.Match[str]]:
    matches = [m for m in map(STEP_LINE.match, stdout.splitlines()) if m]
    assert [int(m.group(1)) for m in matches] == list(range(1, steps + 1)), stdout
    assert all(m.group(3) == "0" for m in matches), f"failed rollouts:\n{stdout}"
    assert f"run finished at step {steps}" in stdout, stdout
    assert stdout.count(CONSOLE_LEGEND) == 1, stdout  # once, above the step lines
    return matches


@pytest.mark.parametrize("page", [QUICKSTART, EXAMPLES], ids=lambda p: p.name)
def test_every_train_command_on_the_page_composes(page: Path) -> None:
    commands = _train_commands(page.read_text())
    assert commands, f"no python -m core.train command found in {page}"
    for command in commands:
        cfg = _compose(_overrides(command))
        assert cfg.task.name and cfg.backend.name, command


def _choosing_things() -> list[str]:
    """README's "Choosing things" commands, comments removed."""
    (block,) = _blocks(_section(README.read_text(), "## Choosing things"), "console")
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


README_RUN_AS_WRITTEN = {"python -m core.plugins", "python -m core.train --cfg job"}
"""Cheap: run exactly as written."""
README_ELSEWHERE = {
    "python -m core.train task=math_agent trainer.max_steps=3": "test_each_example_trains_with_its_documented_command",
    "python -m core.view RUN_DIR": "tests/view (the viewer's server, API and page on a real run)",
    "python -m core.train backend=verl": "plugins/verl/tests, in the verl venv (bash plugins/verl/scripts/run_tests.sh)",
    "python -m core.train sampler=sglang sampler.urls='[http://10.0.0.5:30000]'":
        "composed here; tests/trainer/test_fleet.py trains through real servers (marker long)",
}
"""Run by another test, or needing what this environment has not (named with each)."""


def test_every_readme_command_is_run_or_accounted_for() -> None:
    """A new line in README's "Choosing things" must be run here or say which test runs it."""
    for command in _choosing_things():
        known = command in README_RUN_AS_WRITTEN or command in README_ELSEWHERE
        assert known or (command.startswith("python -m core.train ") and "--cfg" not in command), command
        if command.startswith("python -m core.train") and "backend=verl" not in command:
            overrides = [o for o in _overrides(command) if o not in ("--cfg", "job")]
            assert _compose(overrides).task.name, command


@pytest.mark.slow
def test_readme_commands_run(tmp_path: Path) -> None:
    """README's "Choosing things", run: the cheap ones as written, the trainings cut to 2 steps
    (their full runs are the learning tests': tests/learning)."""
    jobs: list[tuple[str, Path | None, tuple[str, ...]]] = []  # (command, its run_dir when it trains, cut)
    for command in _choosing_things():
        if command in README_ELSEWHERE:
            continue
        if command in README_RUN_AS_WRITTEN:
            jobs.append((command, None, ()))
            continue
        run_dir = tmp_path / f"run{abs(hash(command))}"
        jobs.append((command, run_dir, ("trainer.max_steps=2", "trainer.eval_every=0", "trainer.progress=false",
                                        f"run_dir={run_dir}")))
    procs = _run_all([(command, cut) for command, _, cut in jobs], tmp_path)
    for (command, trains_in, _), proc in zip(jobs, procs, strict=True):
        if trains_in is None:
            assert proc.returncode == 0 and proc.stdout.strip(), (command, proc.stderr[-2000:])
            continue
        assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-3000:])
        steps = re.findall(r"^step +(\d+)  reward \d\.\d{3}  failed 0  lp-gap ", proc.stdout, re.MULTILINE)
        assert steps == ["1", "2"], (command, proc.stdout)  # async lines add `stale m/M`
        assert proc.stdout.count(CONSOLE_LEGEND) == 1, proc.stdout
        assert f"next: python -m core.view {trains_in}" in proc.stdout, proc.stdout


def test_quickstart_names_only_scripts_that_exist() -> None:
    text = QUICKSTART.read_text()
    for script in re.findall(r"python (benchmarks/\S+\.py)", text):
        assert (ROOT / script).is_file(), script
    for module in re.findall(r"python -m (core\.[a-z_.]+)", text):
        path = ROOT / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module


def test_the_quickstart_agent_needs_only_the_main_install() -> None:
    """`bash scripts/setup.sh` (no test extra) must provide what the page's agent imports."""
    import ast
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    main = {re.split(r"[<>=\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    section = _section(QUICKSTART.read_text(), "## 2. Bring your own agent")
    for block in _blocks(section, "python"):
        for node in ast.walk(ast.parse(block)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top == "core":
                    continue
                assert top in main, f"the quickstart's agent imports {top!r}, not in the main install"


@pytest.mark.slow
def test_bring_your_own_agent_runs_as_written(tmp_path: Path) -> None:
    section = _section(QUICKSTART.read_text(), "## 2. Bring your own agent")
    (agent,) = [b for b in _blocks(section, "python") if "@app.entrypoint" in b]
    (data,) = _blocks(section, "json")
    (tmp_path / "my_agent.py").write_text(agent)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(data)
    commands = _train_commands(section)
    cpu = [c for c in commands if "backend.model=" not in c and "--cfg" not in c]
    assert cpu[0].startswith("python -m core.train task=custom"), cpu
    proc = _run(cpu[0], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shown = _blocks(section, "text")[0]
    steps = len([ln for ln in shown.splitlines() if STEP_LINE.match(ln)])
    _check_step_lines(proc.stdout, steps)
    _check_shown_lines(proc.stdout, shown)
    assert "outputs/" in proc.stdout and list(tmp_path.glob("outputs/*/*/metrics.jsonl"))


EXAMPLE_TEST = "test_each_example_trains_with_its_documented_command"


def _example_command(task: str) -> str:
    (command,) = [c for c in _train_commands(EXAMPLES.read_text()) if f"task={task} " in c]
    return command


@pytest.fixture(scope="module")
def example_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[subprocess.Popen[str], Path]]]:
    """The documented training of each example selected in this session, all started at the
    first such test: independent processes, so the second one uses the core the first leaves idle."""
    tasks = sorted({str(item.callspec.params["task"]) for item in request.session.items
                    if isinstance(item, pytest.Function) and item.originalname == EXAMPLE_TEST})
    runs: dict[str, tuple[subprocess.Popen[str], Path]] = {}
    try:
        for task in tasks:
            folder = tmp_path_factory.mktemp(task)
            argv = [sys.executable, *shlex.split(_example_command(task))[1:], f"run_dir={folder / 'run'}"]
            with (folder / "stdout").open("w") as out, (folder / "stderr").open("w") as err:  # not pipes: nobody
                # reads a run's output until its test comes up, and a full pipe would stop it
                runs[task] = (subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=out, stderr=err, text=True), folder)
        yield runs
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("task", ["math_agent", "strands_math_agent"])
def test_each_example_trains_with_its_documented_command(
    task: str, example_runs: dict[str, tuple[subprocess.Popen[str], Path]]
) -> None:
    command = _example_command(task)
    started, folder = example_runs[task]
    started.wait(timeout=300)
    run_dir = folder / "run"
    proc = subprocess.CompletedProcess(started.args, started.returncode, (folder / "stdout").read_text(),
                                       (folder / "stderr").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = int(re.search(r"trainer\.max_steps=(\d+)", command).group(1))  # type: ignore[union-attr]
    _check_step_lines(proc.stdout, steps)
    _check_shown_lines(proc.stdout, _blocks(EXAMPLES.read_text(), "text")[0])
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "rollouts/total" in r]
    assert all(r["rollouts/ok"] == r["rollouts/total"] == 16 for r in train), train
    assert sum(r["turns/total"] for r in train) >= 48  # every rollout made its model call


def test_no_file_in_the_repository_refers_to_a_path_outside_it() -> None:
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    work = "/" + "work/"  # spelled in two pieces so this file does not match itself
    outside = re.compile(
        rf"(?<![\w/.]){work}|\.\./shared|(?<![\w/])shared/(research|seeds|hooks|PRODUCT|STYLE)"
    )
    hits = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".pt", ".parquet", ".png"}:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}: {m.group(0)}" for m in outside.finditer(text)]
    assert not hits, hits


@pytest.mark.slow
def test_local_backend_page_names_the_metric_keys_a_run_writes(tmp_path: Path) -> None:
    """docs/backends/local.md's `train/...` names are keys of a real run's metrics.jsonl
    (one step; cross_entropy trains even when no group has an advantage)."""
    documented = set(re.findall(r"`(train/[a-z_]+)`", (ROOT / "docs/backends/local.md").read_text()))
    assert {"train/logprob_diff_max", "train/loss"} <= documented
    command = (
        "python -m core.train trainer.max_steps=1 trainer.batch_size=2 trainer.group_size=4 "
        "trainer.eval_size=1 trainer.canary=false trainer.save_every=0 "
        f"algorithm.loss=cross_entropy trainer.progress=false run_dir={tmp_path / 'run'}"
    )
    proc = _run(command, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    written = {key for r in records for key in r}
    assert documented <= written, sorted(documented - written)


# -- docs/eval.md, docs/real_models.md, docs/samplers.md: every command run or accounted for ----


@dataclass(frozen=True)
class PageCommand:
    """How one command of a docs page is checked here."""

    how: str
    """``run`` (by ``test_page_commands_run``), ``composed`` (its config only) or ``not run``."""
    why: str
    """What a run substitutes or cuts, or why the command is not run."""
    replace: tuple[tuple[str, str], ...] = ()
    """Text of the command replaced before it runs or composes (``{name}``: the test's paths)."""
    append: tuple[str, ...] = ()
    """Overrides added after the command: cuts (steps, rows) and where it writes."""
    makes: str = ""
    """A file the run must leave, relative to its working directory."""
    shows: str = ""
    """Text the run must print (on stdout or stderr)."""


EVAL_CUT = ("eval.limit=4", "eval.progress=false", "runtime.num_processes=1")
TRAIN_CUT = ("trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=2",
             "trainer.eval_every=0", "trainer.progress=false")
TASK_ARGS = "task=custom task.agent=my_agent:app task.train_path=data/train.jsonl"
SCRIPTED = "a scripted OpenAI-compatible server on loopback (tests/eval/scripted_openai.py; no network here)"
TINY = "{model}: the tiny model as a Hugging Face directory (export_model of a fresh local backend)"
NO_GPU = "needs a GPU and vLLM/SGLang, neither of which is here"
STAND_IN = (
    "needs a GPU and vLLM/SGLang; python -m tracerl_local.serve (the local backend's server, which speaks "
    "both engines' token and weight-update APIs) stands in for it in the training command below"
)
SLEEP = (
    "needs a GPU and vLLM/SGLang with sleep mode; tests/samplers/test_fleet_sleep.py drives "
    "sampler.sleep_during_train against stand-ins of the engines' sleep routes"
)
SERVED = (
    "{server}: python -m tracerl_local.serve serving {model} on CPU for the engine; "
    + TINY + " for Qwen3-4B; backend.device=cpu; one step of 2x2 rollouts"
)

PAGE_COMMANDS: dict[str, dict[str, PageCommand]] = {
    "docs/eval.md": {
        "python -m core.eval eval.checkpoint=RUN_DIR": PageCommand(
            "run", "RUN_DIR: a 2-step run of the embedded task; 4 eval rows",
            (("RUN_DIR", "{run}"),), ("eval.output_dir=trained", *EVAL_CUT), "trained/summary.json"),
        "python -m core.eval eval.checkpoint=outputs/.../checkpoints/step_000050": PageCommand(
            "run", "that run's step_000002; 4 eval rows",
            (("outputs/.../checkpoints/step_000050", "{run}/checkpoints/step_000002"),),
            ("eval.output_dir=step2", *EVAL_CUT), "step2/summary.json"),
        "python -m core.eval": PageCommand(
            "run", "4 eval rows", (), ("eval.output_dir=base", *EVAL_CUT), "base/summary.json"),
        "python -m core.eval eval.endpoint=https://api.openai.com/v1 eval.model=gpt-4o-mini": PageCommand(
            "run", f"{SCRIPTED} for api.openai.com, a made-up OPENAI_API_KEY; 4 eval rows",
            (("https://api.openai.com/v1", "{endpoint}"),), ("eval.output_dir=hosted", *EVAL_CUT),
            "hosted/summary.json"),
        "python -m core.eval eval.samples_per_prompt=8 eval.temperature=1.0 reward=math": PageCommand(
            "run", "2 eval rows (16 rollouts)", (),
            ("eval.output_dir=math", "eval.limit=2", "eval.progress=false", "runtime.num_processes=1"),
            "math/summary.json"),
        "python -m core.eval compare base/results.jsonl trained/results.jsonl": PageCommand(
            "run", "as written, on the evaluations of the base model and of the run above", shows="reward_mean"),
        'python -m core.train reward=judge reward.endpoint=https://api.openai.com/v1 reward.model=gpt-4o-mini '
        """'reward.rubric="Full marks for a correct, short answer"'""": PageCommand(
            "run", f"{SCRIPTED} as the judge (0.5 for every trajectory); one step of 2x2 rollouts",
            (("https://api.openai.com/v1", "{endpoint}"),), (*TRAIN_CUT, "run_dir=judged"), "judged/metrics.jsonl"),
        """curl -X POST http://<gateway>/admin/rollouts/<rollout_id>/reward -H "Authorization: Bearer <admin token>" -d '{"reward": 0.7}'""": PageCommand(
            "not run", "needs a rollout waiting for its reward: tests/gateway/test_admin_and_bad_input.py "
            "posts to this route, tests/rewards/test_reward_plugins.py waits for late rewards in a loop"),
    },
    "docs/real_models.md": {
        f"python -m core.train {TASK_ARGS} backend.model=/models/Qwen3-0.6B algorithm.max_tokens=512 "
        "gateway.max_context_tokens=8192 trainer.batch_size=8 trainer.group_size=8": PageCommand(
            "run", f"{TINY} for Qwen3-0.6B, the quickstart's agent and data; one step of 2x2 rollouts",
            (("/models/Qwen3-0.6B", "{model}"),), (*TRAIN_CUT, "run_dir=outputs/my-run"),
            "outputs/my-run/metrics.jsonl"),
        "pip install -e 'plugins/local[lora]'": PageCommand(
            "not run", "installs into this environment; the test extra installs peft (imported before the LoRA run)"),
        "python -m core.train ... backend.model=/models/Qwen3-4B backend.lora.enabled=true "
        "backend.lora.rank=16 backend.lora.alpha=32": PageCommand(
            "run", f"`...`: the command above's task; {TINY} for Qwen3-4B; one step of 2x2 rollouts",
            (("...", TASK_ARGS), ("/models/Qwen3-4B", "{model}")), (*TRAIN_CUT, "run_dir=outputs/my-lora-run"),
            "outputs/my-lora-run/metrics.jsonl"),
        "python -m core.export outputs/my-run exported/my-agent": PageCommand(
            "run", "as written, on the first run above", makes="exported/my-agent/model.safetensors"),
        "python -m core.export outputs/my-run/checkpoints/step_000200 exported/step200": PageCommand(
            "run", "step_000001, the run's one checkpoint",
            (("step_000200", "step_000001"),), makes="exported/step200/model.safetensors"),
        "python -m core.export outputs/my-run exported/my-adapter --adapter": PageCommand(
            "run", "outputs/my-run: the LoRA run above", (("outputs/my-run", "outputs/my-lora-run"),),
            makes="exported/my-adapter/adapter_model.safetensors"),
        "python -m core.export outputs/my-run exported/my-agent-cpu backend.device=cpu": PageCommand(
            "run", "as written", makes="exported/my-agent-cpu/model.safetensors"),
        "vllm serve exported/my-agent --served-model-name my-agent --max-model-len 8192 "
        "--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3": PageCommand("not run", NO_GPU),
        "python -m sglang.launch_server --model-path exported/my-agent --served-model-name my-agent "
        "--context-length 8192 --tool-call-parser qwen25 --reasoning-parser qwen3": PageCommand("not run", NO_GPU),
        "vllm serve /models/Qwen3-4B --enable-lora --max-lora-rank 16 --lora-modules my-agent=exported/my-adapter":
            PageCommand("not run", NO_GPU),
        "python -m sglang.launch_server --model-path /models/Qwen3-4B --enable-lora --max-lora-rank 16 "
        "--lora-paths my-agent=exported/my-adapter": PageCommand("not run", NO_GPU),
    },
    "docs/samplers.md": {
        "VLLM_SERVER_DEV_MODE=1 vllm serve /models/Qwen3-4B --port 8000 --enable-sleep-mode --logprobs-mode "
        "processed_logprobs --max-model-len 8192 --gpu-memory-utilization 0.45": PageCommand("not run", SLEEP),
        "python -m sglang.launch_server --model-path /models/Qwen3-4B --port 30000 --context-length 8192 "
        "--mem-fraction-static 0.45 --enable-memory-saver": PageCommand("not run", SLEEP),
        "VLLM_SERVER_DEV_MODE=1 vllm serve /models/Qwen3-4B --port 8000 --logprobs-mode processed_logprobs "
        "--max-model-len 8192 --gpu-memory-utilization 0.45": PageCommand("not run", STAND_IN),
        "python -m core.train backend.model=/models/Qwen3-4B backend.device=cuda:0 sampler=vllm "
        "sampler.urls='[http://127.0.0.1:8000]' algorithm.max_tokens=1024 gateway.max_context_tokens=8192 "
        "+gateway.chat_template_kwargs.enable_thinking=false": PageCommand(
            "run", SERVED,
            (("/models/Qwen3-4B", "{model}"), ("cuda:0", "cpu"), ("http://127.0.0.1:8000", "{server}")),
            (*TRAIN_CUT, "run_dir=vllm-run"), "vllm-run/metrics.jsonl", "sampler=vllm: 1 server(s) serve weight version 0"),
        "python -m sglang.launch_server --model-path /models/Qwen3-4B --port 30000 --context-length 8192 "
        "--mem-fraction-static 0.45": PageCommand("not run", STAND_IN),
        "python -m core.train backend.model=/models/Qwen3-4B backend.device=cuda:0 sampler=sglang "
        "sampler.urls='[http://127.0.0.1:30000]' algorithm.max_tokens=1024 gateway.max_context_tokens=8192 "
        "+gateway.chat_template_kwargs.enable_thinking=false": PageCommand(
            "run", SERVED,
            (("/models/Qwen3-4B", "{model}"), ("cuda:0", "cpu"), ("http://127.0.0.1:30000", "{server}")),
            (*TRAIN_CUT, "run_dir=sglang-run"), "sglang-run/metrics.jsonl", "sampler=sglang: 1 server(s) serve weight version 0"),
    },
}
"""Every command of these pages' console and bash blocks, in the order a run needs them."""


def _page_commands(page: str) -> list[str]:
    """A page's console/bash commands: continuation lines joined, spaces collapsed, comments dropped."""
    text = (ROOT / page).read_text()
    commands = []
    for block in _blocks(text, "console") + _blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(line.split("  #")[0].split())
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def _as_run(command: str, how: PageCommand, paths: dict[str, str]) -> str:
    for old, new in how.replace:
        command = command.replace(old, new.format(**paths))
    return command


def test_every_page_command_is_run_or_accounted_for() -> None:
    """A new command on these pages fails here until PAGE_COMMANDS says how it is checked; every
    ``core.train``/``core.eval`` one that is run or composed composes (substitutions applied)."""
    paths = {"run": "/tmp/run", "model": "/tmp/model", "endpoint": "http://127.0.0.1:9/v1", "server": "http://127.0.0.1:9"}
    for page, listed in PAGE_COMMANDS.items():
        on_page = _page_commands(page)
        assert sorted(set(on_page) - set(listed)) == [], f"{page}: commands not in PAGE_COMMANDS"
        assert sorted(set(listed) - set(on_page)) == [], f"{page}: PAGE_COMMANDS lists commands gone from the page"
        for command, how in listed.items():
            assert how.how in {"run", "composed", "not run"} and how.why, command
            words = shlex.split(_as_run(command, how, paths))
            if how.how != "not run" and words[:2] == ["python", "-m"] and words[2] in {"core.train", "core.eval"}:
                if words[3:4] != ["compare"]:
                    assert _compose([*words[3:], *how.append]).task.name, command


def _scripted_reply(body: dict[str, Any]) -> str:
    """A judge's scores (0.5 for each trajectory shown) or, to an agent, the digit 4."""
    ids = re.findall(r'id="(t\d+)"', body["messages"][-1]["content"])
    return json.dumps({"scores": [{"id": i, "score": 0.5, "why": "fixed"} for i in ids]}) if ids else "4"


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


def _page_setup(page: str, cwd: Path, stack: ExitStack) -> dict[str, str]:
    """What a page's commands assume exists: eval.md a trained run; real_models.md the
    quickstart's agent and data and a model directory; samplers.md a model directory and
    a server of it (``python -m tracerl_local.serve``, stopped when ``stack`` closes)."""
    if page == "docs/eval.md":
        command = f"python -m core.train {' '.join(TRAIN_CUT)} trainer.max_steps=2 run_dir={cwd / 'run'}"
        proc = _run(command, cwd)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return {"run": str(cwd / "run")}
    import asyncio

    import peft  # noqa: F401  (the LoRA run needs it: the test extra installs it)
    from tracerl_local.backend import LocalBackend
    from tracerl_local.config import LocalBackendConfig

    section = _section(QUICKSTART.read_text(), "## 2. Bring your own agent")
    (agent,) = [b for b in _blocks(section, "python") if "@app.entrypoint" in b]
    (cwd / "my_agent.py").write_text(agent)
    (cwd / "data").mkdir()
    (cwd / "data" / "train.jsonl").write_text(_blocks(section, "json")[0])
    backend = LocalBackend(LocalBackendConfig(), seed=0)
    try:
        model = asyncio.run(backend.export_model(str(cwd / "models" / "tiny")))
    finally:
        asyncio.run(backend.aclose())
    if page != "docs/samplers.md":
        return {"model": model}
    serve = subprocess.Popen(
        [sys.executable, "-m", "tracerl_local.serve", "--model", model, "--device", "cpu", "--port", "0"],
        cwd=cwd, env=_env(), stdout=subprocess.PIPE, text=True,
    )
    stack.callback(_stop, serve)
    assert serve.stdout is not None
    return {"model": model, "server": json.loads(serve.stdout.readline())["url"]}


@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", ["docs/eval.md", "docs/real_models.md", "docs/samplers.md"])
def test_page_commands_run(page: str, tmp_path: Path) -> None:
    """The commands PAGE_COMMANDS marks ``run``, in a fresh directory, in its order, with its
    substitutions and cuts; each must succeed, leave the file and print the text it names."""
    from tests.eval.scripted_openai import ScriptedOpenAI

    with ScriptedOpenAI(_scripted_reply) as server, ExitStack() as stack:
        paths = {**_page_setup(page, tmp_path, stack), "endpoint": server.base_url}
        for command, how in PAGE_COMMANDS[page].items():
            if how.how != "run":
                continue
            proc = _run(_as_run(command, how, paths), tmp_path, *how.append, env={"OPENAI_API_KEY": "sk-docs-walk"})
            assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-3000:])
            assert not how.makes or (tmp_path / how.makes).is_file(), (command, how.makes, proc.stdout[-2000:])
            assert how.shows in proc.stdout + proc.stderr, (command, how.shows, proc.stdout[-2000:])
        requests = list(server.requests)
    if page == "docs/eval.md":
        hosted = json.loads((tmp_path / "hosted" / "summary.json").read_text())
        assert hosted["rollouts"] == 4 and hosted["failed"] == 0, hosted
        assert json.loads((tmp_path / "math" / "summary.json").read_text())["rollouts"] == 16
        judged = [json.loads(ln) for ln in (tmp_path / "judged" / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("reward/judge") == 0.5 for r in judged), judged
        assert {r["model"] for r in requests} == {"gpt-4o-mini"}


@pytest.mark.long
def test_quickstart_real_model_command_runs_on_a_model_directory(tmp_path: Path) -> None:
    """Quickstart's ``backend.model=/path/to/hf/model`` line, with the tiny model as a Hugging
    Face directory for the path (no real model here), the page's agent and data, one step."""
    section = _section(QUICKSTART.read_text(), "## 2. Bring your own agent")
    (command,) = [c for c in _train_commands(section) if "backend.model=" in c]
    assert "backend.model=/path/to/hf/model" in command, command
    paths = _page_setup("docs/real_models.md", tmp_path, ExitStack())
    proc = _run(command.replace("/path/to/hf/model", paths["model"]), tmp_path, *TRAIN_CUT, "run_dir=run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "run finished at step 1 (task=custom backend=local)" in proc.stdout, proc.stdout

"""The viewer in a real headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): overview -> step -> trajectory on a short real run, checked against the
run's metrics and stored traces. Screenshots land in the test's tmp dir."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.rundir.metrics import read_metrics
from core.rundir.traces import read_traces, rows_of, trace_path
from core.view.__main__ import main as view_main
from core.view.server import ViewServer

from .view_agents import HOSTILE

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip(
            "no Chromium installed (need chromium and chromedriver on PATH: "
            "`apt-get install chromium chromium-driver`, which `bash scripts/setup.sh test` runs as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_view(driver: Any, view: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d: Any) -> Any:
        found = d.find_elements(By.CSS_SELECTOR, f'main#view[data-view="{view}"]')
        return found[0] if found else False

    try:
        return WebDriverWait(driver, 30).until(ready)
    except Exception:
        shown = driver.find_elements(By.CSS_SELECTOR, "main#view")
        raise AssertionError(
            f"the page did not show the {view} view; it shows: "
            + (shown[0].text[:1000] if shown else driver.page_source[:1000])
        ) from None


def test_overview_step_trajectory_in_chromium(trained_run: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    run_dir: Path = trained_run["run_dir"]
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    server = ViewServer(run_dir, "127.0.0.1", 0)
    server.start_background()
    try:
        # -- overview: reward per step and status counts as in metrics.jsonl
        browser.get(server.url)
        main = _wait_view(browser, "overview")
        browser.save_screenshot(str(tmp_path / "overview.png"))
        assert main.find_element(By.ID, "card-steps").text.endswith("3")
        for r in records:
            cell = main.find_element(By.CSS_SELECTOR, f'#steps-table tr[data-step="{r["step"]}"] td.reward')
            assert cell.text == f"{r['reward/mean']:.3f}"
        crashed = sum(r["rollouts/crashed"] for r in records)
        ok = sum(r["rollouts/ok"] for r in records)
        assert crashed > 0
        count = lambda s: main.find_element(By.CSS_SELECTOR, f'#status-counts tr[data-status="{s}"] td.count').text  # noqa: E731
        assert count("crashed") == str(crashed) and count("ok") == str(ok)
        assert len(main.find_elements(By.CSS_SELECTOR, "svg polyline, svg rect")) > 10  # the charts drew
        # the agents' own metrics (succ_digit returns reply_chars), charted per step
        agent_chart = main.find_element(By.CSS_SELECTOR, '[data-chart="Agent metrics (mean per step)"]')
        assert "reply_chars" in agent_chart.text
        evals = [a.text for a in main.find_elements(By.CSS_SELECTOR, "#eval-links a[href^='#/step/eval/']")]
        assert evals == ["step 0", "step 3"]

        # -- step view of a step with a failed rollout
        step = next(r for r in records if r["rollouts/crashed"] > 0)
        main.find_element(By.CSS_SELECTOR, f'#steps-table tr[data-step="{step["step"]}"] a').click()
        main = _wait_view(browser, "step")
        rows = main.find_elements(By.CSS_SELECTOR, "tr[data-rollout]")
        assert len(rows) == step["rollouts/total"]
        assert len(main.find_elements(By.CSS_SELECTOR, 'tr[data-status="crashed"]')) == step["rollouts/crashed"]
        Select(main.find_element(By.ID, "filter-status")).select_by_value("crashed")
        assert main.find_element(By.ID, "shown").text.startswith(f"{step['rollouts/crashed']} of 16")
        browser.save_screenshot(str(tmp_path / "step.png"))

        # -- the failed rollout: its status and its error, shown as text (never run)
        main.find_element(By.CSS_SELECTOR, 'tr[data-status="crashed"]').click()
        main = _wait_view(browser, "rollout")
        assert main.find_element(By.ID, "rollout-status").text == "crashed"
        assert HOSTILE in main.find_element(By.ID, "rollout-error").text
        assert browser.execute_script("return window.__xss === undefined")
        assert not main.find_elements(By.CSS_SELECTOR, "#rollout-error img, #rollout-error script")
        browser.save_screenshot(str(tmp_path / "failed_rollout.png"))

        # -- an ok rollout: reward, and the trained-token span matches the stored trace
        stored = read_traces(trace_path(run_dir, "train", 2))
        target = next(r for r in stored.rollouts if r["status"] == "ok" and r["rows"])
        browser.get("about:blank")  # a fresh load: a hash change alone would leave the old view up a moment
        browser.get(f"{server.url}#/rollout/train/2/{target['rollout_id']}")
        main = _wait_view(browser, "rollout")
        assert main.find_element(By.ID, "rollout-status").text == "ok"
        assert main.find_element(By.ID, "rollout-reward").text == f"{target['reward']:.3f}"
        row = rows_of(target)[0]
        trained = main.find_elements(By.CSS_SELECTOR, '.tokens[data-row="0"] span.tok.trained')
        want = [(i, t) for i, (t, m) in enumerate(zip(row.token_ids, row.loss_mask, strict=True)) if m]
        assert [(int(s.get_attribute("data-i")), int(s.get_attribute("data-id"))) for s in trained] == want
        assert [float(s.get_attribute("data-lp")) for s in trained] == pytest.approx([row.logprobs[i] for i, _ in want], abs=1e-6)
        context = main.find_elements(By.CSS_SELECTOR, '.tokens[data-row="0"] span.tok.ctx')
        assert len(context) == len(row.token_ids) - len(want)
        marks = main.find_elements(By.CSS_SELECTOR, '.tokens[data-row="0"] .turnmark')
        assert [m.text for m in marks] == [f"turn {k + 1} · v{t.weight_version}" for k, t in enumerate(row.turns)]
        assert main.find_element(By.CSS_SELECTOR, '#conversation .msg[data-role="user"]').text.endswith(
            f"After {target['payload']['n']}?"
        )
        browser.execute_script("document.querySelector('.rowbox').scrollIntoView()")
        browser.save_screenshot(str(tmp_path / "rollout.png"))

        # -- compare: the same eval prompt before training and at the end
        browser.get("about:blank")
        browser.get(f"{server.url}#/compare/0/3/eval1")
        main = _wait_view(browser, "compare")
        sides = main.find_elements(By.CSS_SELECTOR, ".side")
        assert [s.get_attribute("data-step") for s in sides] == ["0", "3"]
        assert all("After 1?" in s.text for s in sides)
    finally:
        server.shutdown()
        server.server_close()

    # -- the static export shows the same overview from a file, no server
    out = tmp_path / "static.html"
    assert view_main([str(run_dir), "--static", str(out)]) == 0
    browser.get(out.as_uri())
    main = _wait_view(browser, "overview")
    assert main.find_element(By.CSS_SELECTOR, '#status-counts tr[data-status="crashed"] td.count').text == str(crashed)
    browser.get("about:blank")
    browser.get(out.as_uri() + f"#/step/train/{step['step']}")
    main = _wait_view(browser, "step")
    assert len(main.find_elements(By.CSS_SELECTOR, 'tr[data-status="crashed"]')) == step["rollouts/crashed"]
    for name in ("overview", "step", "failed_rollout", "rollout"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def test_tree_session_forks_show_as_branches(browser: Any, tmp_path: Path) -> None:
    """A session whose history forked (tree mode): two rows sharing a prefix, the
    conversation with two continuations of the first reply. Written with the trace
    writer (no training needed to lay out a fork). Then a step without traces."""
    from types import SimpleNamespace

    from selenium.webdriver.common.by import By

    from core.rundir.traces import TraceWriter
    from core.types import (
        FinishReason,
        RolloutRequest,
        RolloutResult,
        RolloutStatus,
        TraceRecord,
        TurnSpan,
    )

    trunk = list(range(10, 40))
    a, b = trunk + list(range(40, 50)), trunk + list(range(60, 66))

    def row(ids: list[int], spans: list[tuple[int, int, int]], index: int) -> TraceRecord:
        mask, lps = [0] * len(ids), [0.0] * len(ids)
        for s, e, _ in spans:
            mask[s:e] = [1] * (e - s)
            lps[s:e] = [-0.1 * (k + 1) for k in range(e - s)]
        return TraceRecord("tr-x", ids, mask, lps, 10, [TurnSpan(s, e, FinishReason.STOP, v) for s, e, v in spans], index)

    rows = [row(a, [(10, 20, 1), (30, 40, 2)], 0), row(b, [(30, 36, 3)], 1)]
    rows[1].turns.insert(0, TurnSpan(10, 20, FinishReason.STOP, 1))  # shared turn: context in row 1
    conversation = [
        {"parent": -1, "messages": [{"role": "user", "content": "plan <b>it</b>"}], "turn": None},
        {"parent": 0, "messages": [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"q": "x"}}}]}],
         "turn": 0, "weight_version": 1, "finish_reason": "stop"},
        {"parent": 1, "messages": [{"role": "tool", "content": "result A", "tool_call_id": "c1"}], "turn": None},
        {"parent": 2, "messages": [{"role": "assistant", "content": "answer A", "reasoning_content": "think A"}],
         "turn": 1, "weight_version": 2, "finish_reason": "stop"},
        {"parent": 1, "messages": [{"role": "tool", "content": "result B", "tool_call_id": "c1"}], "turn": None},
        {"parent": 4, "messages": [{"role": "assistant", "content": "answer B"}], "turn": 2, "weight_version": 3, "finish_reason": "stop"},
    ]
    outcome = SimpleNamespace(
        request=RolloutRequest("r0", "s1-g0", {"q": "x"}, "http://x/v1", "tr-x", "m"),
        result=RolloutResult("r0", RolloutStatus.OK, reward=0.5, elapsed_s=1.0),
        rows=rows, faults={}, conversation=conversation,
    )
    TraceWriter(tmp_path, 1, decode=lambda ids: f"t{ids[0]} ").write_step(1, [outcome], {"r0": 0.25}, weight_version=3)
    server = ViewServer(tmp_path, "127.0.0.1", 0)
    server.start_background()
    try:
        browser.get("about:blank")
        browser.get(f"{server.url}#/rollout/train/1/r0")
        main = _wait_view(browser, "rollout")
        branches = main.find_elements(By.CSS_SELECTOR, "#conversation .fork > .branch")
        assert len(branches) == 2
        assert "result A" in branches[0].text and "answer A" in branches[0].text and "answer B" not in branches[0].text
        assert "result B" in branches[1].text and "answer B" in branches[1].text
        assert branches[0].find_element(By.CSS_SELECTOR, "details.reasoning pre").text == "think A"
        assert "search" in main.find_element(By.CSS_SELECTOR, "#conversation .call").text
        assert main.find_element(By.CSS_SELECTOR, '#conversation .msg[data-role="user"] pre').text == "plan <b>it</b>"
        for k, want in enumerate(rows):
            spans = main.find_elements(By.CSS_SELECTOR, f'.tokens[data-row="{k}"] span.tok')
            assert [int(s.get_attribute("data-id")) for s in spans] == want.token_ids
            trained = [int(s.get_attribute("data-i")) for s in spans if "trained" in s.get_attribute("class")]
            assert trained == [i for i, m in enumerate(want.loss_mask) if m]
        marks = main.find_elements(By.CSS_SELECTOR, '.tokens[data-row="1"] .turnmark')
        assert [m.text for m in marks] == ["turn 1 · v1", "turn 2 · v3"]
        browser.save_screenshot(str(tmp_path / "fork.png"))
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/1")
        main = _wait_view(browser, "step")
        assert main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r0"] td.weights').text == "v1 v2 v3 −2"
        # A step whose traces are not stored (removed by trainer.keep_traces, or never
        # written): a page saying so with the stored step next to it, not a bare error.
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/0")
        main = _wait_view(browser, "missing")
        assert "stored are 1 steps, from 1 to 1" in main.find_element(By.ID, "missing").text
        assert main.find_element(By.CSS_SELECTOR, 'a[href="#/step/train/1"]').text == "train step 1 →"
    finally:
        server.shutdown()
        server.server_close()


def test_parse_statuses_are_shown_on_each_turn_and_filter_the_step(browser: Any, tmp_path: Path) -> None:
    """A step whose turns carry tool-call parse statuses: the step view lists them per rollout
    and its parse filter keeps only the rollouts with a turn of the chosen status; the
    rollout view shows each turn's status, and why a failed one failed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from .parse_step import BAD_JSON_DETAIL, write_parse_step

    write_parse_step(tmp_path)
    server = ViewServer(tmp_path, "127.0.0.1", 0)
    server.start_background()
    try:
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/1")
        main = _wait_view(browser, "step")
        shown = lambda: [r.get_attribute("data-rollout") for r in main.find_elements(By.CSS_SELECTOR, "tr[data-rollout]")]  # noqa: E731
        parses = lambda rid: [b.text for b in main.find_elements(By.CSS_SELECTOR, f'tr[data-rollout="{rid}"] td.parse .badge')]  # noqa: E731
        assert sorted(shown()) == ["r-calls", "r-json", "r-plain"]
        assert parses("r-json") == ["calls 1", "bad_json 1"] and parses("r-plain") == ["no_tools 1"]
        assert "bad" in main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r-json"] [data-parse="bad_json"]').get_attribute("class")
        select = Select(main.find_element(By.ID, "filter-parse"))
        assert [o.text for o in select.options] == [
            "all tool-call parses", "any failed (1)", "no_tools (1)", "text (1)", "calls (2)", "bad_json (1)",
        ]
        select.select_by_value("bad_json")
        main = _wait_view(browser, "step")
        assert shown() == ["r-json"] and main.find_element(By.ID, "shown").text.startswith("1 of 3")
        browser.save_screenshot(str(tmp_path / "parse_filter.png"))
        Select(main.find_element(By.ID, "filter-parse")).select_by_value("calls")
        assert sorted(shown()) == ["r-calls", "r-json"]
        Select(main.find_element(By.ID, "filter-parse")).select_by_value("failed")
        assert shown() == ["r-json"]
        Select(main.find_element(By.ID, "filter-parse")).select_by_value("all")
        assert len(shown()) == 3

        main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r-json"]').click()
        main = _wait_view(browser, "rollout")
        heads = main.find_elements(By.CSS_SELECTOR, '#conversation .msg[data-role="assistant"] .role [data-parse]')
        # (the role line is shown in capitals: its text content is compared)
        assert [b.get_attribute("textContent") for b in heads] == ["parse: bad_json", "parse: calls"]
        assert heads[0].get_attribute("title") == BAD_JSON_DETAIL
        (why,) = main.find_elements(By.CSS_SELECTOR, "#conversation .parse-detail")
        assert why.text == f"tool call bad_json: {BAD_JSON_DETAIL}"
        turns = main.find_elements(By.CSS_SELECTOR, ".rowhead [data-parse]")
        assert [b.text for b in turns] == ["turn 1 parse: bad_json", "turn 2 parse: calls"]
        browser.save_screenshot(str(tmp_path / "parse_rollout.png"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_turn_a_weight_update_interrupted_is_marked_with_each_version(browser: Any, tmp_path: Path, byte_tokenizer: Any) -> None:
    """Partial rollouts (#28): the step table counts the interrupted turn; the rollout view
    shows the turn's versions in order (conversation and row header), a marker where the
    new weights took over, and each trained token's version on hover."""
    from selenium.webdriver.common.by import By

    from .segment_step import NEW, OLD, SPLIT, write_segment_step

    write_segment_step(tmp_path, byte_tokenizer)
    server = ViewServer(tmp_path, "127.0.0.1", 0)
    server.start_background()
    try:
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/1")
        main = _wait_view(browser, "step")
        cell = main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r-seg"] td.weights')
        assert f"v{OLD} v{NEW}" in cell.text and "1 interrupted" in cell.text
        main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r-seg"]').click()
        main = _wait_view(browser, "rollout")
        (badge,) = main.find_elements(By.CSS_SELECTOR, '#conversation .msg[data-role="assistant"] .badge.segmented')
        assert badge.get_attribute("textContent") == f"weights v{OLD}→v{NEW}"
        (head,) = main.find_elements(By.CSS_SELECTOR, ".rowhead .badge.segmented")
        assert f"v{OLD}→v{NEW}" in head.text
        marks = [m.get_attribute("textContent") for m in main.find_elements(By.CSS_SELECTOR, ".tokens .turnmark")]
        assert marks[0] == f"turn 1 · v{OLD}" and marks[1].startswith(f"v{NEW} · weight update")
        trained = main.find_elements(By.CSS_SELECTOR, ".tokens .tok.trained")
        titles = [t.get_attribute("title") for t in trained]
        assert all(t.endswith(f"weights v{OLD}") for t in titles[:SPLIT])
        assert all(t.endswith(f"weights v{NEW}") for t in titles[SPLIT:]) and len(titles) > SPLIT
        browser.save_screenshot(str(tmp_path / "segments_rollout.png"))
    finally:
        server.shutdown()
        server.server_close()


def test_each_turns_policy_is_shown_and_filters_the_step(browser: Any, tmp_path: Path) -> None:
    """A step whose turns come from two policies (#34): the step view counts each rollout's
    turns per policy and its policy filter keeps the rollouts with a turn of that policy;
    the rollout view names the policy of each generated turn and of each row."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from .policy_step import write_policy_step

    write_policy_step(tmp_path)
    server = ViewServer(tmp_path, "127.0.0.1", 0)
    server.start_background()
    try:
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/1")
        main = _wait_view(browser, "step")
        shown = lambda: sorted(r.get_attribute("data-rollout") for r in main.find_elements(By.CSS_SELECTOR, "tr[data-rollout]"))  # noqa: E731
        policies = lambda rid: [b.text for b in main.find_elements(By.CSS_SELECTOR, f'tr[data-rollout="{rid}"] td.policy .badge')]  # noqa: E731
        assert shown() == ["r-both", "r-coder", "r-planner"]
        assert policies("r-both") == ["coder 1", "planner 1"] and policies("r-planner") == ["planner 2"]
        assert "policies (turns)" in [th.text for th in main.find_elements(By.CSS_SELECTOR, "thead th")]
        select = Select(main.find_element(By.ID, "filter-policy"))
        assert [o.text for o in select.options] == ["all policies", "coder (2)", "planner (2)"]
        select.select_by_value("coder")
        main = _wait_view(browser, "step")
        assert shown() == ["r-both", "r-coder"] and main.find_element(By.ID, "shown").text.startswith("2 of 3")
        browser.save_screenshot(str(tmp_path / "policy_filter.png"))
        Select(main.find_element(By.ID, "filter-policy")).select_by_value("planner")
        assert shown() == ["r-both", "r-planner"]
        Select(main.find_element(By.ID, "filter-policy")).select_by_value("all")
        assert len(shown()) == 3

        main.find_element(By.CSS_SELECTOR, 'tr[data-rollout="r-both"]').click()
        main = _wait_view(browser, "rollout")
        heads = main.find_elements(By.CSS_SELECTOR, '#conversation .msg[data-role="assistant"] .role [data-policy]')
        assert [b.get_attribute("textContent") for b in heads] == ["policy: planner", "policy: coder"]
        rows = main.find_elements(By.CSS_SELECTOR, ".rowhead [data-policy]")
        assert [b.text for b in rows] == ["policy: planner", "policy: coder"]
        browser.save_screenshot(str(tmp_path / "policy_rollout.png"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_without_policies_shows_no_policy_column_or_filter(browser: Any, tmp_path: Path) -> None:
    """Every turn of the default policy: the step view stays as it was (no column, no filter)."""
    from selenium.webdriver.common.by import By

    from .parse_step import write_parse_step

    write_parse_step(tmp_path)
    server = ViewServer(tmp_path, "127.0.0.1", 0)
    server.start_background()
    try:
        browser.get("about:blank")
        browser.get(f"{server.url}#/step/train/1")
        main = _wait_view(browser, "step")
        assert len(main.find_elements(By.CSS_SELECTOR, "tr[data-rollout]")) == 3
        assert not main.find_elements(By.ID, "filter-policy") and not main.find_elements(By.CSS_SELECTOR, "td.policy")
        assert "policies (turns)" not in [th.text for th in main.find_elements(By.CSS_SELECTOR, "thead th")]
    finally:
        server.shutdown()
        server.server_close()

"""The viewer's data, server and static export, on a real short run (no browser)."""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.errors import ConfigError
from core.rundir.metrics import read_metrics
from core.rundir.traces import list_traces, read_traces, rows_of, trace_path
from core.types import DEFAULT_POLICY
from core.view.__main__ import main as view_main
from core.view.data import RunData
from core.view.server import ViewServer

from .view_agents import HOSTILE

pytestmark = pytest.mark.integration


@contextmanager
def _serving(run_dir: Path, host: str = "127.0.0.1") -> Iterator[ViewServer]:
    """A viewer server on ``host`` (any free port) for the block, then shut down."""
    server = ViewServer(run_dir, host, 0)
    server.start_background()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_train_prints_where_the_viewer_is(trained_run: dict[str, Any]) -> None:
    assert f"python -m core.view {trained_run['run_dir']}" in trained_run["stdout"]


def test_run_stores_every_step_and_eval_and_the_data_matches_metrics(trained_run: dict[str, Any]) -> None:
    run_dir: Path = trained_run["run_dir"]
    assert list_traces(run_dir) == {"train": [1, 2, 3], "eval": [0, 3]}
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    data = RunData(run_dir)
    overview = data.overview()
    assert [s["step"] for s in overview["steps"]] == [1, 2, 3]
    assert overview["statuses"]["crashed"] == sum(r["rollouts/crashed"] for r in records) > 0
    assert overview["statuses"]["ok"] == sum(r["rollouts/ok"] for r in records)
    for record in records:
        step = data.step("train", record["step"])
        assert len(step["rollouts"]) == record["rollouts/total"] == 16
        assert sum(r["status"] == "crashed" for r in step["rollouts"]) == record["rollouts/crashed"]
        assert sum(r["trained"] for r in step["rollouts"]) >= record["tokens/trained"]
        assert record["traces/bytes"] == trace_path(run_dir, "train", record["step"]).stat().st_size
        ok = [r["reward"] for r in step["rollouts"] if r["status"] == "ok"]
        assert sum(ok) / len(ok) == pytest.approx(record["reward/mean"])
        # the agent's own metric (reply_chars), the mean over its ok rollouts, in the record and the overview
        stored = read_traces(trace_path(run_dir, "train", record["step"])).rollouts
        chars = [r["metrics"]["reply_chars"] for r in stored if r["status"] == "ok"]
        assert record["agent/reply_chars"] == pytest.approx(sum(chars) / len(chars))
        (shown,) = [s for s in overview["steps"] if s["step"] == record["step"]]
        assert shown["agent/reply_chars"] == record["agent/reply_chars"]
    crashed = next(r for r in data.step("train", 1)["rollouts"] + data.step("train", 2)["rollouts"] if r["status"] == "crashed")
    assert crashed["payload"]["fail"] is True and crashed["rows"] == 0


def test_server_answers_on_loopback_only_for_its_own_host(trained_run: dict[str, Any]) -> None:
    with _serving(trained_run["run_dir"]) as server:
        port = server.server_address[1]

        def get(path: str, host: str) -> tuple[int, dict[str, str], bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", path, headers={"Host": host})
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            return resp.status, dict(resp.getheaders()), body

        status, headers, body = get("/", f"127.0.0.1:{port}")
        assert status == 200 and "script-src 'nonce-" in headers["Content-Security-Policy"]
        assert b"<script nonce=" in body and b"https://" not in body  # offline: nothing fetched elsewhere
        status, _, body = get("/api/run", f"localhost:{port}")
        assert status == 200 and json.loads(body)["traces"]["train"] == [1, 2, 3]
        status, _, body = get("/api/step?kind=train&step=99", f"localhost:{port}")
        assert status == 404 and b"no train traces stored for step 99" in body
        status, _, _ = get("/api/run", "evil.example:80")  # DNS rebinding
        assert status == 403


def test_static_export_embeds_hostile_text_inert(trained_run: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    assert view_main([str(trained_run["run_dir"]), "--static", str(out)]) == 0
    page = out.read_text()
    assert page.count("</script>") == 2  # the data block's and the app's: no string closed one
    assert HOSTILE not in page and "onerror" in page  # the crash message is there, escaped
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page


def test_refresh_sees_new_steps_and_rewritten_files(trained_run: dict[str, Any], tmp_path: Path) -> None:
    """A copy of the run missing its last step, then the step arriving, as while training."""
    run = tmp_path / "live"
    shutil.copytree(trained_run["run_dir"], run, ignore=shutil.ignore_patterns("checkpoints"))
    last = trace_path(run, "train", 3)
    saved = last.read_bytes()
    last.unlink()
    data = RunData(run)
    assert data.overview()["traces"]["train"] == [1, 2]
    first = data.step("train", 2)
    last.write_bytes(saved)
    assert data.overview()["traces"]["train"] == [1, 2, 3]
    # a resumed run rewrites a step file: the cache notices
    shutil.copy(trace_path(run, "train", 1), trace_path(run, "train", 2))
    assert data.step("train", 2)["rollouts"] != first["rollouts"]


def test_rollout_rows_are_the_stored_rows(trained_run: dict[str, Any]) -> None:
    run_dir: Path = trained_run["run_dir"]
    stored = read_traces(trace_path(run_dir, "train", 2))
    ok = next(r for r in stored.rollouts if r["status"] == "ok")
    view = RunData(run_dir).rollout("train", 2, ok["rollout_id"])
    rows = rows_of(ok)
    assert [r["token_ids"] for r in view["rows"]] == [r.token_ids for r in rows]
    assert [r["mask"] for r in view["rows"]] == [r.loss_mask for r in rows]
    assert all(t for r in view["rows"] for t in r["texts"])  # every token has its text
    assert "".join(view["rows"][0]["texts"]).count("After") == 1


def test_not_a_run_directory_is_a_clear_error(trained_run: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a run directory.*runs inside it"):
        RunData(Path(trained_run["run_dir"]).parent)
    with pytest.raises(ConfigError, match="does not exist"):
        RunData(tmp_path / "nope")
    assert view_main([str(tmp_path), "--static", str(tmp_path / "x.html")]) == 2


def test_cli_serves_the_run_on_loopback(trained_run: dict[str, Any]) -> None:
    """``python -m core.view RUN_DIR --port 0`` prints its URL and serves the run there."""
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "core.view", str(trained_run["run_dir"]), "--port", "0"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:"), line
        with urllib.request.urlopen(url + "api/run", timeout=30) as resp:
            assert json.loads(resp.read())["traces"] == {"train": [1, 2, 3], "eval": [0, 3]}
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert b'id="app"' in resp.read()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)  # reaps it and closes the pipes


def test_an_unreadable_trace_file_is_a_json_error_not_a_dropped_connection(tmp_path: Path) -> None:
    """An OSError reading the run (here a trace "file" that is a directory) answers 500
    with the reason; it used to escape the handler, which closed the connection unanswered."""
    run_dir = tmp_path / "run"
    (run_dir / "traces" / "train_000001.jsonl.gz").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    with _serving(run_dir) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/api/step?kind=train&step=1")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 500 and "cannot read the run's files" in body["error"]
        conn.request("GET", "/api/run")  # the same connection still serves
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["traces"]["train"] == [1]
        conn.close()


def test_server_listens_on_ipv6_loopback(tmp_path: Path) -> None:
    """``--host ::1`` (which the CLI treats as loopback) serves, and checks ``Host`` there too;
    it failed with ``gaierror: Address family for hostname not supported``."""
    import socket

    try:  # a host without IPv6 loopback cannot run this (the fix is then moot there)
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback on this machine: {exc}")
    (tmp_path / "metrics.jsonl").write_text("")
    with _serving(tmp_path, "::1") as server:
        assert server.url.startswith("http://[::1]:")
        port = server.server_address[1]
        for host, status in ((f"[::1]:{port}", 200), (f"localhost:{port}", 200), ("evil.example", 403)):
            conn = http.client.HTTPConnection("::1", port, timeout=30)
            conn.request("GET", "/api/run", headers={"Host": host})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            assert resp.status == status, host


def test_steps_removed_by_retention_are_a_clear_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainer.keep_traces`` deletes old training steps' files while the viewer runs: a
    removed step answers 404 naming the stored range and the setting (a file deleted
    between its stat and its read was a 500), and a static export leaves it out."""
    from core.rundir.traces import TraceWriter
    from core.types import RolloutRequest, RolloutResult, RolloutStatus
    from core.view import data as view_data

    outcome = SimpleNamespace(
        request=RolloutRequest("r0", "g0", {"n": 1}, "http://x/v1", "s", "m"),
        result=RolloutResult("r0", RolloutStatus.CRASHED, error="boom"), rows=[], faults={}, conversation=[],
    )
    writer = TraceWriter(tmp_path, 1, keep=2)
    for step in (1, 2, 3, 4):
        writer.write_step(step, [outcome], {})
    (tmp_path / "metrics.jsonl").write_text("")
    run = RunData(tmp_path)
    assert run.overview()["traces"]["train"] == [3, 4]
    with pytest.raises(KeyError, match=r"step 1: stored are 2 steps, from 3 to 4.*trainer.keep_traces"):
        run.step("train", 1)
    real_read = view_data.read_traces
    doomed = {trace_path(tmp_path, "train", 3), trace_path(tmp_path, "train", 4)}

    def removed_meanwhile(path: Path) -> Any:
        if path in doomed:  # the training run's retention, between the viewer's stat and read
            doomed.discard(path)
            path.unlink()
        return real_read(path)

    monkeypatch.setattr(view_data, "read_traces", removed_meanwhile)
    with _serving(tmp_path) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/api/step?kind=train&step=3")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 404 and "from 4 to 4" in body["error"], body
        conn.close()
    writer.write_step(5, [outcome], {})  # the export finds 4 and 5 stored, then 4 is removed
    exported = RunData(tmp_path).export(None)
    assert exported["run"]["traces"]["train"] == [5] and "train/4" not in exported["steps"]


def test_a_real_run_s_turns_are_no_tools_and_the_api_says_so(trained_run: dict[str, Any]) -> None:
    """The toy task offers no tools: every turn of every stored rollout is ``no_tools``, in the
    step summary (counts per rollout) and in the rollout (one status per turn)."""
    data = RunData(trained_run["run_dir"])
    step = data.step("train", 1)
    ok = [r for r in step["rollouts"] if r["status"] == "ok"]
    assert ok and all(r["parse"] == {"no_tools": r["turns"]} for r in ok)
    full = data.rollout("train", 1, ok[0]["rollout_id"])
    assert [p["status"] for row in full["rows"] for p in row["parse"]] == ["no_tools"] * ok[0]["turns"]
    assert all(n["parse"] == "no_tools" for n in full["conversation"] if n["turn"] is not None)


def test_parse_statuses_in_the_step_summary_and_the_rollout_over_http(tmp_path: Path) -> None:
    from .parse_step import BAD_JSON_DETAIL, STATUSES, write_parse_step

    write_parse_step(tmp_path)
    with _serving(tmp_path) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/api/step?kind=train&step=1")
        step = json.loads(conn.getresponse().read())
        assert {r["rollout_id"]: r["parse"] for r in step["rollouts"]} == {
            "r-json": {"calls": 1, "bad_json": 1},
            "r-calls": {"text": 1, "calls": 1},
            "r-plain": {"no_tools": 1},
        }
        conn.request("GET", "/api/rollout?kind=train&step=1&id=r-json")
        rollout = json.loads(conn.getresponse().read())
        conn.close()
    (row,) = rollout["rows"]
    assert row["parse"] == [{"status": "bad_json", "detail": BAD_JSON_DETAIL}, {"status": "calls", "detail": ""}]
    turns = [n for n in rollout["conversation"] if n["turn"] is not None]
    assert [n["parse"] for n in turns] == [s.value for s in STATUSES["r-json"]]
    assert turns[0]["parse_detail"] == BAD_JSON_DETAIL and "parse_detail" not in turns[1]


def test_traces_written_before_parse_statuses_show_none(tmp_path: Path) -> None:
    """A trace file of an older tracerl (four-item turns, no parse keys in the conversation)
    still opens: no counts, and no status per turn."""
    from core.rundir.traces import write_trace_file

    from .parse_step import write_parse_step

    write_parse_step(tmp_path)
    path = trace_path(tmp_path, "train", 1)
    old = read_traces(path)
    for record in old.rollouts:
        for row in record["rows"]:
            row["turns"] = [t[:4] for t in row["turns"]]
        for node in record["conversation"]:
            node.pop("parse", None)
            node.pop("parse_detail", None)
    write_trace_file(path, old.header, old.rollouts)
    data = RunData(tmp_path)
    assert all(r["parse"] == {} for r in data.step("train", 1)["rollouts"])
    (row,) = data.rollout("train", 1, "r-json")["rows"]
    assert row["parse"] == [None, None]


def test_a_turn_a_weight_update_interrupted_shows_its_segments_over_http(tmp_path: Path, byte_tokenizer: Any) -> None:
    """Partial rollouts (#28): the step summary lists both segments' versions and counts the
    interrupted turn; the rollout gives each turn's segments (row positions and versions)
    and the conversation node the versions in order, for the page to mark."""
    from .segment_step import NEW, OLD, SPLIT, write_segment_step

    write_segment_step(tmp_path, byte_tokenizer)
    with _serving(tmp_path) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/api/step?kind=train&step=1")
        (summary,) = json.loads(conn.getresponse().read())["rollouts"]
        conn.request("GET", "/api/rollout?kind=train&step=1&id=r-seg")
        rollout = json.loads(conn.getresponse().read())
        conn.close()
    assert summary["weight_versions"] == [OLD, NEW] and summary["interrupted_turns"] == 1
    (row,) = rollout["rows"]
    ((start, end, _, version),) = row["turns"]
    assert version == OLD
    assert row["segments"] == [[[start, start + SPLIT, OLD], [start + SPLIT, end, NEW]]]
    assert row["logprobs"][start:end] == [-0.5] * SPLIT + [-2.0] * (end - start - SPLIT)
    (node,) = [n for n in rollout["conversation"] if n["turn"] is not None]
    assert node["weight_version"] == OLD and node["weight_versions"] == [OLD, NEW]


def test_policies_in_the_step_summary_and_the_rollout_over_http(tmp_path: Path) -> None:
    """Each rollout's turns counted by the policy that generated them; each row's policy (a
    row never mixes policies) and each generated conversation node's (#34)."""
    from .policy_step import POLICIES, write_policy_step

    write_policy_step(tmp_path)
    with _serving(tmp_path) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/api/step?kind=train&step=1")
        step = json.loads(conn.getresponse().read())
        conn.request("GET", "/api/rollout?kind=train&step=1&id=r-both")
        rollout = json.loads(conn.getresponse().read())
        conn.close()
    assert {r["rollout_id"]: r["policies"] for r in step["rollouts"]} == {
        "r-both": {"coder": 1, "planner": 1}, "r-planner": {"planner": 2}, "r-coder": {"coder": 1},
    }
    assert [row["policy"] for row in rollout["rows"]] == ["planner", "coder"]
    assert [n["policy"] for n in rollout["conversation"] if n["turn"] is not None] == POLICIES["r-both"]


def test_a_run_without_policies_counts_its_turns_under_the_default_one(tmp_path: Path) -> None:
    """Traces of a run that configures no policies (and older ones, which store none) give
    every turn the default policy, so the viewer shows no policy column or filter."""
    from .parse_step import STATUSES, write_parse_step

    write_parse_step(tmp_path)
    data = RunData(tmp_path)
    step = data.step("train", 1)
    assert {r["rollout_id"]: r["policies"] for r in step["rollouts"]} == {
        rid: {DEFAULT_POLICY: len(statuses)} for rid, statuses in STATUSES.items()
    }
    assert [row["policy"] for row in data.rollout("train", 1, "r-json")["rows"]] == [DEFAULT_POLICY]

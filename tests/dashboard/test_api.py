"""The dashboard's JSON API over real run directories: runs, metrics of a run being
written, ledger pages and filters, one rollout with its mask, groups, reports, and every
bad input answered with a 4xx, never a 500 or a traceback."""

from __future__ import annotations

import json
import os
import time

import pytest
from dashboard.runs_fixture import KNOWN_SELECTED, KNOWN_TEXT, write_metrics

from rldojo.dashboard.runs import LIVE_S, RunIndex
from rldojo.store.run_dir import record_config_change
from rldojo.training.stops import FailureBudgetExceeded, RunInterrupted

pytestmark = pytest.mark.slow  # tiny-random's tokenizer reads the ledger


def test_runs_table_rows(client):
    runs = {r["id"]: r for r in client.get("api/runs").json()["runs"]}
    assert {"alpha", "beta", "gamma"} <= set(runs)  # (and the runs other tests add)
    alpha = runs["alpha"]
    assert alpha["status"] == "finished" and alpha["model"] == "tiny-random"
    assert alpha["steps"] == 4 and alpha["planned_steps"] == 4
    assert alpha["accuracy_before"] == 0.25 and alpha["accuracy_after"] == 0.5
    assert alpha["reward"] == 0.4 and alpha["wall_s"] == 12.8
    assert runs["beta"]["status"] == "running"  # no summary, files just written
    assert runs["beta"]["bad_lines"] == 1  # the line being written is skipped, counted


def test_run_page_data(client):
    data = client.get("api/run", params={"id": "alpha"}).json()
    assert [r["step"] for r in data["train"]] == [1, 2, 3, 4]
    assert [(e["step"], e["eval/ci_low"]) for e in data["evals"]] == [(0, 0.1), (4, 0.3)]
    assert data["checkpoints"][0]["step"] == 4
    assert data["config"]["model"]["name"] == "tiny-random"
    assert 'name = "tiny-random"' in data["config_text"]


def test_pages_filters_and_counts(client, served):
    _, ids, _ = served
    page = client.get("api/rollouts", params={"run": "alpha"}).json()
    assert page["total"] == 6
    assert [r["id"] for r in page["rows"]][:2] == sorted([ids["failed"], ids["tool"]], reverse=True)
    by = lambda **p: client.get("api/rollouts", params={"run": "alpha", **p}).json()  # noqa: E731
    assert [r["id"] for r in by(status="timeout")["rows"]] == [ids["failed"]]
    assert by(step=1)["total"] == 4  # ledger step 0: the first step's rollouts
    assert by(score_min=0.5)["total"] == 3 and by(score_max=0)["total"] == 2
    assert [r["id"] for r in by(text="so Answer")["rows"]] == [ids["known"]]
    assert by(text="100%_")["total"] == 0  # LIKE wildcards are literal
    assert by(env="arith-tools-v1")["total"] == 1 and by(task="train/0/8")["total"] == 1
    assert [r["id"] for r in by(trained="true")["rows"]] == sorted(
        [ids["known"], ids["known"] + 1, ids["known"] + 2, ids["known"] + 3], reverse=True
    )
    second = by(limit=2, offset=2)
    assert len(second["rows"]) == 2 and second["total"] == 6
    facets = client.get("api/facets", params={"run": "alpha"}).json()
    assert facets["envs"] == ["arith-tools-v1", "arith-v1"] and "timeout" in facets["statuses"]


def test_one_rollout_has_its_mask_and_tokens(client, served, tiny):
    _, ids, _ = served
    _, tokenizer = tiny
    r = client.get("api/rollout", params={"run": "alpha", "id": ids["known"]}).json()
    assert r["selected"] == KNOWN_SELECTED and r["advantage"] == 0.87 and r["trained"] == 1
    tokens = [t for seg in r["segments"] for t in seg["tokens"]]
    expected = tokenizer.encode(KNOWN_TEXT, add_special_tokens=False)
    assert [t["t"] for t in tokens] == [tokenizer.decode([i]) for i in expected]
    assert [t["i"] for t in tokens if t["sel"]] == KNOWN_SELECTED
    assert r["prompt"][0]["role"] == "user" and r["tokens_note"] is None
    tool = client.get("api/rollout", params={"run": "alpha", "id": ids["tool"]}).json()
    assert [s["policy"] for s in tool["segments"]] == [True, False, True]
    assert (
        "".join(t["t"] for t in tool["segments"][1]["tokens"]) == "<tool_response>5</tool_response>"
    )
    assert [m["role"] for m in tool["turns"]] == ["assistant", "tool", "assistant"]


def test_group_side_by_side(client):
    g = client.get("api/group", params={"run": "alpha", "step": 1,
                                        "task": "arith-v1/train/0/7"}).json()  # fmt: skip
    assert [(r["sample_index"], r["score"]) for r in g["rows"]] == [
        (0, 1.0),
        (1, -0.5),
        (2, -0.5),
        (3, 1.0),
    ]


def test_reports_render(client):
    reports = client.get("api/reports").json()["reports"]
    assert [(r["id"], r["kind"]) for r in reports] == [("0/evals/report.md", "eval")]
    html = client.get("api/report", params={"id": "0/evals/report.md"}).json()["html"]
    assert "<table>" in html and "McNemar p = 0.031" in html


def test_bad_input_is_4xx_never_500(client, served):
    _, _, root = served
    (root / "outside.md").write_text("# rldojo eval: x\n")
    cases = {
        ("api/run", (("id", "../../etc"),)): 404,
        ("api/run", (("id", "nope"),)): 404,
        ("api/rollouts", (("run", "gamma"),)): 404,  # metrics, no ledger yet
        ("api/rollouts", (("run", "alpha"), ("step", "x"))): 422,
        ("api/rollouts", (("run", "alpha"), ("limit", "100000"))): 422,
        ("api/rollout", (("run", "alpha"), ("id", "999999"))): 404,
        ("api/group", (("run", "alpha"), ("step", "7"), ("task", "none"))): 404,
        ("api/report", (("id", "0/../../etc/passwd.md"),)): 404,
        ("api/plot", (("id", "0/../alpha/ledger.sqlite"),)): 404,
        ("static/..%2Fapp.py", ()): 404,
    }
    for (url, params), status in cases.items():
        r = client.get(url, params=dict(params))
        assert r.status_code == status, (url, params, r.text)
        assert "Traceback" not in r.text
    gamma = client.get("api/rollouts", params={"run": "gamma"}).json()["detail"]
    assert "no ledger.sqlite" in gamma


def test_listens_on_loopback_by_default(served):
    handle, _, _ = served
    assert handle.host == "127.0.0.1"


def test_status_of_a_run_from_its_files(served):
    _, _, root = served
    index = RunIndex([root])
    beta, alpha = index.get("beta"), index.get("alpha")
    assert alpha is not None and beta is not None
    changed = max(f.stat().st_mtime for f in beta.path.iterdir())
    assert beta.status(now=changed + LIVE_S / 2) == "running"
    assert beta.status(now=changed + LIVE_S + 1) == "stopped"  # killed: resume continues it
    assert alpha.status(now=0) == "finished"
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir(exist_ok=True)
    (outside / "metrics.jsonl").write_text("")
    assert index.get(f"../{outside.name}") is None  # a real run, but outside the root
    (root / "link").symlink_to(outside)
    assert index.get("link") is None  # nor through a symlink
    assert "link" not in {r.id for r in index.runs()}
    (root / "link").unlink()


def _ended_run(path, stopped: str, steps: int) -> None:
    """A run directory as the run loop leaves it: config, metrics, a checkpoint (none when
    the failure budget stopped it) and `summary.json` with the keys `_finish` writes."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text('[model]\nname = "tiny-random"\n\n[run]\nsteps = 4\n')
    write_metrics(path / "metrics.jsonl", steps)
    record_config_change(path, "start", {})
    checkpoint = None
    if stopped != FailureBudgetExceeded.stopped:
        checkpoint = path / "checkpoints" / f"step_{steps:06d}"
        checkpoint.mkdir(parents=True)
    evals = {"before": {"accuracy": 0.25, "n": 4}}
    summary = {"command": "train", "model": "tiny-random", "env": "arith-v1", "steps": steps,
               "accuracy_before": 0.25, "accuracy_after": None, "evals": evals,
               "wall_s": 3.2 * steps, "run_dir": str(path), "stopped": stopped,
               "checkpoint": None if checkpoint is None else str(checkpoint)}  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary, indent=2))
    old = time.time() - 10 * LIVE_S  # the run ended a while ago
    for f in path.iterdir():
        os.utime(f, (old, old))


def test_status_says_how_a_run_ended(tmp_path):
    ends = {
        "steps": "finished",
        "max_minutes": "finished",
        "callback": "finished",
        RunInterrupted.stopped: "interrupted",
        FailureBudgetExceeded.stopped: "failed",
    }
    for stopped in ends:
        _ended_run(tmp_path / stopped, stopped, steps=2)
    rows = {r["id"]: r for r in (run.row() for run in RunIndex([tmp_path]).runs())}
    assert {k: (r["status"], r["stopped_by"]) for k, r in rows.items()} == {
        k: (status, k) for k, status in ends.items()
    }
    assert rows["interrupted"]["steps"] == 2 and rows["failures"]["wall_s"] == 6.4
    # Resumed: a new start after the interrupted attempt's summary; that summary is stale.
    resumed = RunIndex([tmp_path]).get("interrupted")
    assert resumed is not None
    record_config_change(resumed.path, "resume", {})
    now = resumed.file("config_history.jsonl").stat().st_mtime
    assert resumed.status(now=now + 1) == "running"
    assert resumed.status(now=now + LIVE_S + 1) == "stopped"  # killed after resuming
    assert resumed.row()["stopped_by"] is None


def test_command_refuses_a_missing_directory(tmp_path):
    from typer.testing import CliRunner

    from rldojo.cli import app

    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "not a directory" in result.output and "Traceback" not in result.output

"""`rldojo curate` on the tiny model with a task file and a dedup set."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.registry import make_env
from rldojo.eval.curate import task_row

pytestmark = pytest.mark.slow  # curates with tiny-random

runner = CliRunner()


def test_curate_file_dedup_band_and_outputs(tmp_path):
    tasks = make_env("arith-v1").tasks("test", n=5)
    data, seen = tmp_path / "tasks.jsonl", tmp_path / "seen.jsonl"
    data.write_text("\n".join(json.dumps(task_row(t)) for t in tasks))
    seen.write_text(json.dumps({"question": tasks[0].info["question"]}) + "\n")
    out = tmp_path / "kept.jsonl"
    args = ["curate", "--data", str(data), "--model", "tiny-random", "--samples", "2",
            "--rounds", "2", "--band", "[0,0.4]", "--max-new-tokens", "3",
            "--dedup-against", str(seen), "--out", str(out),
            "--estimates", str(tmp_path / "all.jsonl"), "--plot", str(tmp_path / "h.png"),
            "--report", str(tmp_path / "r.json")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "1 near-duplicates removed" in result.output and "0/2" in result.output
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in kept] == [
        t.id for t in tasks[1:]
    ]  # a random model: rate 0, in [0, 0.4]
    assert all(r["pass_rate"] == 0.0 and r["samples"] == 2 for r in kept)
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["duplicates_removed"] == 1 and summary["kept"] == 4
    assert summary["histogram"][0] == ["0/2", 4]
    assert (tmp_path / "h.png").exists() and len(
        (tmp_path / "all.jsonl").read_text().splitlines()
    ) == 4
    result = runner.invoke(app, ["curate", "--band", "0.5", "--model", "tiny-random"])
    assert result.exit_code == 2 and "band '0.5'" in result.output

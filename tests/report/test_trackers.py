"""`run.report_to` sinks with the real trackers, offline: what each stores (read back with
its own reader) equals what `metrics.jsonl` holds; a resume continues the same tracker run;
a missing package is a one-line config error before anything is written."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_config import tiny_overrides

from rldojo.config import ConfigError, load_config
from rldojo.report.metrics import MetricsLogger, read_metrics, split_values
from rldojo.report.trackers import TrackerUnavailable, _wandb_mode, check_report_to, read_state
from rldojo.training.loop import run_training

TRACKERS = ["wandb", "trackio", "mlflow"]
Rows = list[tuple[int, str, Any]]


def expected(run_dir: Path) -> Rows:
    """`(step, name, value)` of every scalar and text the sinks were given, from
    `metrics.jsonl` (the JSONL file is the reference every tracker is checked against)."""
    rows = []
    for record in read_metrics(run_dir):
        step, kind = record.pop("step"), record.pop("kind")
        scalars, texts = split_values(record, kind=kind)
        rows += [(step, k, v) for k, v in {**scalars, **texts}.items()]
    return rows


def numbers(rows: Rows) -> list[tuple[int, str, float]]:
    return sorted((s, k, float(v)) for s, k, v in rows if not isinstance(v, str))


def texts(rows: Rows) -> list[tuple[int, str, str]]:
    return sorted((s, k, v) for s, k, v in rows if isinstance(v, str))


def _wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a `.wandb` file: W&B's LevelDB-style log (7-byte file
    header, 32 KiB blocks, chunks with a crc32/length/type header), decoded with W&B's
    own `Record` message (wandb ships no Python reader for the file any more)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, chunk, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += block - pos % block
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def read_wandb(root: Path, run_id: str) -> list[dict[str, Any]]:
    """Per offline invocation of run `run_id` under `root` (a `wandb/` folder), in order:
    `{"rows": [(step, name, value)], "exit_code": int | None}`."""
    invocations = []
    for path in sorted(root.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        rows, exit_code = [], None
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                step = record.history.step.num
                for item in record.history.item:
                    name = "/".join(item.nested_key) or item.key
                    if not name.startswith("_"):
                        rows.append((step, name, json.loads(item.value_json)))
            elif kind == "exit":
                exit_code = record.exit.exit_code
        invocations.append({"rows": rows, "exit_code": exit_code})
    return invocations


def read_trackio(project: str, run_id: str) -> Rows:
    from trackio.sqlite_storage import SQLiteStorage

    rows = []
    for log in SQLiteStorage.get_logs(project, run_id=run_id):
        step = log.pop("step")
        log.pop("timestamp")
        rows += [(step, k, v) for k, v in log.items()]
    return rows


def read_mlflow(run_dir: Path, tmp: Path) -> dict[str, Any]:
    """The MLflow run of RUN/trackers.json: status, params, metric history, text files."""
    from mlflow import MlflowClient

    state = read_state(run_dir)["mlflow"]
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run = client.get_run(state["run_id"])
    rows: Rows = []
    for key in run.data.metrics:
        rows += [(m.step, key, m.value) for m in client.get_metric_history(run.info.run_id, key)]
    if client.list_artifacts(run.info.run_id, "text"):
        local = Path(client.download_artifacts(run.info.run_id, "text", str(tmp)))
        for file in local.rglob("step_*.txt"):
            name = str(file.parent.relative_to(local))
            rows.append((int(file.stem.removeprefix("step_")), name, file.read_text()))
    return {"run": run, "rows": rows}


def read_tensorboard(run_dir: Path) -> Rows:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, tag, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]


def assert_same(got: Rows, want: Rows) -> None:
    """Same texts, and the same numbers at the same steps (exactly: float64 throughout)."""
    assert texts(got) == texts(want)
    assert numbers(got) == numbers(want)


@pytest.mark.slow
def test_each_tracker_stores_the_jsonl_records_and_a_resume_continues_its_run(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_PROJECT", "p-wandb")
    monkeypatch.setenv("TRACKIO_PROJECT", f"p-trackio-{tmp_path.name}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "p-mlflow")
    (tmp_path / "wandb-dir").mkdir()
    run = tmp_path / "run-a"
    run.mkdir()
    config = {"loss": {"rho": 0.2}, "run": {"steps": 2, "report_to": TRACKERS}}
    logger = MetricsLogger(run, report_to=TRACKERS, config=config)
    logger.log(0, {"eval/accuracy": 0.25}, kind="eval")
    train = {"reward/mean": 0.5, "loss/pg": math.nan, "train/skipped": True,
             "rollout/samples": 8, "entropy/forking_tokens": ["'a'×2", "'b'×1"]}  # fmt: skip
    logger.log(1, train)
    logger.log(1, {"accuracy": 0.75}, kind="eval")  # under eval/accuracy in the trackers
    logger.close()
    state = read_state(run)
    assert state["wandb"]["project"] == "p-wandb"
    want = expected(run)
    assert (1, "eval/accuracy", 0.75) in want and (1, "train/skipped", 1) in want
    assert all(k != "loss/pg" for _, k, _ in want)  # NaN: the JSONL file (as null) only

    # The resumed invocation (after step 1's checkpoint) logs step 2, then crashes.
    resumed = MetricsLogger(run, report_to=TRACKERS, resume_step=1, config=config)
    with pytest.raises(RuntimeError, match="crash"):
        try:
            resumed.log(2, {"reward/mean": 1.5})
            raise RuntimeError("crash")
        finally:
            resumed.close()
    assert read_state(run) == state  # the same tracker runs
    want = expected(run)
    assert (2, "reward/mean", 1.5) in want

    wandb_runs = read_wandb(tmp_path / "wandb-dir" / "wandb", state["wandb"]["id"])
    assert len(wandb_runs) == 2  # one offline file per invocation, both of the same run id
    assert_same([r for w in wandb_runs for r in w["rows"]], want)
    assert [w["exit_code"] for w in wandb_runs] == [0, 1]

    from trackio.sqlite_storage import SQLiteStorage

    project = state["trackio"]["project"]
    assert project == f"p-trackio-{tmp_path.name}" and state["trackio"]["name"] == "run-a"
    assert SQLiteStorage.get_runs(project) == ["run-a"]
    assert_same(read_trackio(project, state["trackio"]["id"]), want)
    assert SQLiteStorage.get_run_config(project, "run-a")["loss"] == {"rho": 0.2}

    mlflow = read_mlflow(run, tmp_path / "artifacts")
    assert state["mlflow"]["tracking_uri"] == f"sqlite:///{run.resolve()}/mlflow.db"
    assert_same(mlflow["rows"], want)
    assert mlflow["run"].info.run_name == "run-a" and mlflow["run"].info.status == "FAILED"
    params = mlflow["run"].data.params
    assert params == {"loss.rho": "0.2", "run.steps": "2", "run.report_to": json.dumps(TRACKERS)}


TINY = tiny_overrides(
    "sampling.temperature=1.0", "eval.tasks=2", "eval.max_new_tokens=2", "env.train_tasks=10",
    "run.steps=2", "run.threads=1", 'run.report_to=["tensorboard", "wandb", "trackio", "mlflow"]',
)  # fmt: skip


@pytest.fixture
def _restore_threads():
    threads = torch.get_num_threads()  # `run.threads` sets them for the whole process
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # trains tiny-random
def test_a_tiny_training_run_reports_to_every_sink(tmp_path, _restore_threads):
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=tiny"])
    run_training(cfg)
    run = tmp_path / "tiny"
    want = expected(run)
    assert [(r["step"], r["kind"]) for r in read_metrics(run)] == [
        (0, "eval"), (1, "train"), (2, "train"), (2, "eval")
    ]  # fmt: skip
    state = read_state(run)

    tensorboard = read_tensorboard(run)  # float32 event files
    assert [(s, k) for s, k, _ in numbers(tensorboard)] == [(s, k) for s, k, _ in numbers(want)]
    assert [v for *_, v in numbers(tensorboard)] == pytest.approx([v for *_, v in numbers(want)])

    (wandb_run,) = read_wandb(run / "wandb", state["wandb"]["id"])  # RUN/wandb by default
    assert_same(wandb_run["rows"], want)
    assert state["wandb"]["project"] == "rldojo" and wandb_run["exit_code"] == 0

    assert state["trackio"]["project"] == "rldojo" and state["trackio"]["name"] == "tiny"
    assert_same(read_trackio("rldojo", state["trackio"]["id"]), want)

    mlflow = read_mlflow(run, tmp_path / "artifacts")
    assert_same(mlflow["rows"], want)
    assert mlflow["run"].info.status == "FINISHED"
    assert mlflow["run"].data.params["rollout.group_size"] == "2"


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("wandb", "wandb"),
        ("trackio", "trackio"),
        ("mlflow", "mlflow"),
        pytest.param("mlflow", "sqlalchemy", marks=pytest.mark.slow),  # imports mlflow
    ],
)
def test_a_missing_tracker_package_is_a_one_line_config_error(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    hint = "pip install 'rldojo[trackers]'"
    message = f'run.report_to: "{name}" needs the {module} package: {hint}'
    with pytest.raises(TrackerUnavailable) as error:
        check_report_to(["tensorboard", name])
    assert str(error.value) == message and isinstance(error.value, ConfigError)
    with pytest.raises(TrackerUnavailable, match="needs the"):
        MetricsLogger(tmp_path, report_to=[name])
    assert not list(tmp_path.iterdir())  # failed before opening metrics.jsonl
    with pytest.raises(ConfigError, match="unknown sink 'neptune'"):
        check_report_to(["neptune"])


def test_mlflow_with_a_tracking_server_needs_no_sql_packages(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # only imported
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    check_report_to(["mlflow"])


@pytest.mark.slow  # imports every tracker
def test_a_logger_that_logs_nothing_opens_no_tracker_run(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    MetricsLogger(run, report_to=["tensorboard", *TRACKERS]).close()
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_wandb_goes_online_only_with_an_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert _wandb_mode() == "offline"  # no key anywhere
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    assert _wandb_mode() == "online"  # what `wandb login` writes
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert _wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert _wandb_mode() is None  # wandb reads WANDB_MODE itself


def test_split_values_gives_sinks_finite_scalars_and_texts_under_eval_names():
    metrics = {"accuracy": 0.5, "eval/n": 4, "bad": math.inf, "none": None, "ok": True,
               "tokens": ["'a'×2"], "t": torch.tensor(2.0)}  # fmt: skip
    scalars, texts = split_values(metrics, kind="eval")
    assert scalars == {"eval/accuracy": 0.5, "eval/n": 4, "eval/ok": 1, "eval/t": 2.0}
    assert texts == {"eval/tokens": "[\"'a'×2\"]"}
    assert split_values({"loss/pg": 1.0}) == ({"loss/pg": 1.0}, {})


def test_a_missing_tracker_fails_training_in_one_line_before_the_run_dir(tmp_path, monkeypatch):
    import sys

    from typer.testing import CliRunner

    from rldojo.cli import app

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", "--set", "model.name=tiny-random",
                                      "--set", 'run.report_to=["wandb"]',
                                      "--set", f"run.output_dir={out}"])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "needs the wandb package" in lines[0], result.output
    assert not out.exists()

"""The metric sinks behind `run.report_to`: TensorBoard, Weights & Biases, Trackio, MLflow.

`MetricsLogger` (`rldojo.report.metrics`) always writes `RUN/metrics.jsonl` and hands every
record to these sinks as finite scalars and texts (a list, e.g. the forking-token list, as
its `str`) at the record's step. Evaluation records (`kind = "eval"`) arrive under their
`eval/` names at the step they were taken, so a step's training and evaluation metrics
line up. Non-finite values are written to the JSONL file (as null) and to no sink.

What each sink stores, and where (RUN is the run directory; its name is the run name):

- `tensorboard`: RUN/tensorboard/ event files; scalars as scalars, texts with the text
  plugin. A resume purges the events after the checkpoint's step (they are redone).
- `wandb`: a W&B run `id` kept in RUN/trackers.json and opened with `resume="allow"`, so
  a resumed run continues it; project `$WANDB_PROJECT` or `rldojo`; files under
  `$WANDB_DIR` or RUN/wandb/. Scalars and texts go to the run's history at `step`; the
  run config is the W&B config. Mode: `$WANDB_MODE` when set, else `online` only if an
  API key is configured (`$WANDB_API_KEY`, or a `~/.netrc` entry for the W&B host that
  `wandb login` writes) and `offline` otherwise, so a run without an account never goes
  to the network (`wandb sync RUN/wandb/offline-run-*` uploads it later). W&B refuses
  steps below the last one it has: on an online resume, steps redone after a crash keep
  the values the crashed invocation logged.
- `trackio`: project `$TRACKIO_PROJECT` or `rldojo`, stored by trackio in its SQLite
  database `$TRACKIO_DIR/<project>.db` (default `$HF_HOME/trackio`; `trackio show` reads
  it). The run is found again by name on resume (its id is kept in RUN/trackers.json);
  `$TRACKIO_SPACE_ID` / `$TRACKIO_SERVER_URL` send it elsewhere, as trackio documents.
- `mlflow`: `$MLFLOW_TRACKING_URI`, default `sqlite:///RUN/mlflow.db` (artifacts in
  RUN/mlflow-artifacts/; view with `mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db`);
  experiment `$MLFLOW_EXPERIMENT_NAME` or `rldojo`. Scalars are metrics at `step`, texts
  artifacts `text/<name>/step_NNNNNN.txt`, the config params (`section.key`, set once).
  The run id is kept in RUN/trackers.json and the run reopened on resume.

Trackio and MLflow keep every point they are sent: a step redone after a crash appears
twice in their history (both values; the JSONL file keeps the redone one).

A tracker is opened on the first record, like the TensorBoard writer, so an invocation
that logs nothing (a resume of a finished run) adds nothing. A run closed while an error
propagates is marked failed where the tracker has a status (W&B exit code 1, MLflow
`FAILED`). `check_report_to` imports each tracker's package up front: a missing one is a
one-line `ConfigError` before the run starts.
"""

from __future__ import annotations

import json
import netrc
import os
import secrets
import string
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlparse

from rldojo.config import ConfigError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from torch.utils.tensorboard import SummaryWriter
    from trackio.run import Run as TrackioRun
    from wandb.sdk.wandb_run import Run as WandbRun

SINKS = ("tensorboard", "wandb", "trackio", "mlflow")
"""The names `run.report_to` accepts."""
INSTALL_HINT = "pip install 'rldojo[trackers]'"
STATE_FILE = "trackers.json"
"""RUN/trackers.json: each tracker's run identity, so a resume continues the same run."""
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


class TrackerUnavailable(ConfigError):
    """A sink named in `run.report_to` cannot be imported; the message is one line."""


class Sink(Protocol):
    """Receives each record's finite scalars and texts at its step; closed once."""

    def log(
        self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str], *, kind: str
    ) -> None: ...

    def close(self, *, failed: bool = False) -> None: ...


def required_modules(name: str) -> tuple[str, ...]:
    """The modules sink `name` imports (MLflow's SQL stores need SQLAlchemy and alembic)."""
    if name == "mlflow":
        scheme = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:").partition(":")[0]
        sql = scheme.partition("+")[0] in _SQL_SCHEMES
        return ("mlflow", "sqlalchemy", "alembic") if sql else ("mlflow",)
    return () if name == "tensorboard" else (name,)


def check_report_to(names: Iterable[str]) -> None:
    """Raise `ConfigError` (one line) for an unknown sink or a tracker whose package is not
    importable, e.g. `run.report_to: "wandb" needs the wandb package: pip install ...`."""
    import importlib

    for name in names:
        if name not in SINKS:
            raise ConfigError(f"run.report_to: unknown sink {name!r} (one of {', '.join(SINKS)})")
        for module in required_modules(name):
            try:
                importlib.import_module(module)
            except ImportError as exc:
                # When it is one of the package's own dependencies that failed, say which.
                why = "" if exc.name in (module, None) else f" (import failed: {exc})"
                raise TrackerUnavailable(
                    f'run.report_to: "{name}" needs the {module} package{why}: {INSTALL_HINT}'
                ) from exc


def make_sinks(
    names: Iterable[str],
    run_dir: Path,
    *,
    resume_step: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[Sink]:
    """One sink per name, in order (call `check_report_to` first)."""
    cfg = dict(config or {})
    makers: dict[str, Callable[[], Sink]] = {
        "tensorboard": lambda: TensorBoardSink(run_dir, resume_step=resume_step),
        "wandb": lambda: WandbSink(run_dir, cfg),
        "trackio": lambda: TrackioSink(run_dir, cfg),
        "mlflow": lambda: MlflowSink(run_dir, cfg),
    }
    return [makers[name]() for name in dict.fromkeys(names)]


def read_state(run_dir: Path) -> dict[str, Any]:
    """RUN/trackers.json: `{"wandb": {...}, "mlflow": {...}, "trackio": {...}}`."""
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _save_state(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    state = read_state(run_dir) | {name: entry}
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, run_dir / STATE_FILE)


class TensorBoardSink:
    """RUN/tensorboard/, opened on the first record; `resume_step` purges later events."""

    def __init__(self, run_dir: Path, *, resume_step: int | None = None) -> None:
        self._dir = run_dir / "tensorboard"
        self._purge = None if resume_step is None else resume_step + 1
        self._want = True
        self._writer: SummaryWriter | None = None

    def log(
        self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str], *, kind: str
    ) -> None:
        if self._writer is None and self._want:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency, but keep the run alive
                self._want = False
                return
            self._writer = SummaryWriter(log_dir=str(self._dir), purge_step=self._purge)
        if self._writer is None:
            return
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        for key, text in texts.items():
            self._writer.add_text(key, text, step)
        self._writer.flush()

    def close(self, *, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()


def _wandb_mode() -> Literal["online", "offline"] | None:
    """None (wandb reads `$WANDB_MODE`) when set; else online only with an API key."""
    if os.environ.get("WANDB_MODE"):
        return None
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        found = netrc.netrc(os.environ.get("NETRC")).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        found = None
    return "online" if found else "offline"


class WandbSink:
    """A W&B run whose id is kept in RUN/trackers.json (see the module docstring)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self._run_dir = run_dir
        self._config = config
        self.run: WandbRun | None = None

    def _open(self) -> WandbRun:
        import wandb

        run_id = read_state(self._run_dir).get("wandb", {}).get("id")
        if run_id is None:  # W&B ids: lowercase letters and digits
            alphabet = string.ascii_lowercase + string.digits
            run_id = "".join(secrets.choice(alphabet) for _ in range(8))
        project = os.environ.get("WANDB_PROJECT") or "rldojo"
        _save_state(self._run_dir, "wandb", {"id": run_id, "project": project})
        return wandb.init(
            project=project,
            name=self._run_dir.name,
            id=run_id,
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else str(self._run_dir),
            config=self._config,
            mode=_wandb_mode(),
        )

    def log(
        self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str], *, kind: str
    ) -> None:
        if self.run is None:
            self.run = self._open()
        self.run.log({**scalars, **texts}, step=step)

    def close(self, *, failed: bool = False) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None


class TrackioSink:
    """A trackio run named after RUN, resumed by name (see the module docstring)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self._run_dir = run_dir
        self._config = config
        self.run: TrackioRun | None = None

    def _open(self) -> TrackioRun:
        import trackio

        project = os.environ.get("TRACKIO_PROJECT") or "rldojo"
        # A new run directory is a new trackio run even if an old one has its name.
        resume = "allow" if "trackio" in read_state(self._run_dir) else "never"
        run = trackio.init(
            project=project,
            name=self._run_dir.name,
            config=self._config,
            resume=resume,
            embed=False,
            auto_log_cpu=False,  # rldojo logs its own time/ metrics; no sampling thread
            auto_log_gpu=False,
        )
        _save_state(self._run_dir, "trackio", {"project": project, "name": run.name, "id": run.id})
        return run

    def log(
        self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str], *, kind: str
    ) -> None:
        if self.run is None:
            self.run = self._open()
        self.run.log({**scalars, **texts}, step=step)

    def close(self, *, failed: bool = False) -> None:
        if self.run is not None:
            import trackio

            # trackio.finish() joins the writer thread (all logs are in the db) and clears
            # the current run, which trackio would otherwise finish again at exit.
            if trackio.context_vars.current_run.get() is self.run:
                trackio.finish()
            else:
                self.run.finish()
            self.run = None


def _flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    params: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            params |= _flat_params(value, f"{prefix}{key}.")
        else:  # 500 characters: the smallest param limit of MLflow servers still in use
            text = value if isinstance(value, str) else json.dumps(value)
            params[f"{prefix}{key}"] = text[:500]
    return params


class MlflowSink:
    """An MLflow run whose id is kept in RUN/trackers.json (see the module docstring)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self._run_dir = run_dir
        self._config = config
        self.client: MlflowClient | None = None
        self.run_id: str | None = None

    def _open(self) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        local = f"sqlite:///{self._run_dir.resolve() / 'mlflow.db'}"
        uri = os.environ.get("MLFLOW_TRACKING_URI") or local
        self.client = client = MlflowClient(tracking_uri=uri)
        saved = read_state(self._run_dir).get("mlflow", {})
        if saved.get("tracking_uri") == uri and saved.get("run_id"):
            self.run_id = saved["run_id"]
            client.update_run(saved["run_id"], status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "rldojo"
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = (self._run_dir.resolve() / "mlflow-artifacts").as_uri()
            where = artifacts if uri == local else None  # a server has its own store
            experiment_id = client.create_experiment(name, artifact_location=where)
        run = client.create_run(experiment_id, run_name=self._run_dir.name)
        self.run_id = run.info.run_id
        _save_state(self._run_dir, "mlflow", {"tracking_uri": uri, "run_id": self.run_id})
        params = [Param(k, v) for k, v in _flat_params(self._config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            client.log_batch(self.run_id, params=params[i : i + 100], synchronous=True)

    def log(
        self, step: int, scalars: Mapping[str, float], texts: Mapping[str, str], *, kind: str
    ) -> None:
        from mlflow.entities import Metric

        if self.client is None or self.run_id is None:
            self._open()
        client, run_id = self.client, self.run_id
        assert client is not None and run_id is not None
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in scalars.items()]
        client.log_batch(run_id, metrics=metrics, synchronous=True)
        for key, text in texts.items():
            client.log_text(run_id, text, f"text/{key}/step_{step:06d}.txt")

    def close(self, *, failed: bool = False) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
            self.run_id = None

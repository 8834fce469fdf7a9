"""The dashboard web app: HTML pages and the JSON they read, over run directories.

`create_app(roots)` returns a FastAPI app; `rldojo dashboard` serves it (loopback by
default) and the fine-tuning service can mount the same router. Every asset comes from
the package (`static/`, and Plotly's bundled `plotly.min.js`): a page makes no request
off the machine. Pages poll the JSON while a run is `running`, so they update live.

Bad input is a JSON error with a 4xx status, never a 500 or a traceback page: an unknown
run or a path outside the roots is 404, a bad filter is 422 (FastAPI's validation), a
run without a ledger is 404 with the reason; an unexpected error is a 500 with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from rldojo.dashboard import reports as reports_mod
from rldojo.dashboard.rollouts import Filters, LedgerMissing, LedgerView
from rldojo.dashboard.runs import Run, RunIndex, read_metrics
from rldojo.dashboard.tokens import segments, tokenizer_for, turns

STATIC = Path(__file__).parent / "static"
PAGES = ("runs", "run", "rollouts", "rollout", "group", "reports")
"""Page names: `/` is `runs`, `/<name>` the others (each `static/<name>.html`)."""


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _run(index: RunIndex, run_id: str) -> Run:
    run = index.get(run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id!r} under the served directories")
    return run


def _ledger(run: Run) -> LedgerView:
    try:
        return LedgerView(run.file("ledger.sqlite"))
    except LedgerMissing as exc:
        raise HTTPException(404, str(exc)) from exc


def api_router(roots: list[Path]) -> APIRouter:
    """The JSON API under `/api` (what the pages read)."""
    index = RunIndex(roots)
    resolved = index.roots
    api = APIRouter(prefix="/api")

    @api.get("/runs")
    def runs() -> dict[str, Any]:
        return {"runs": [r.row() for r in index.runs()], "roots": [str(r) for r in resolved]}

    @api.get("/run")
    def run(id: str) -> dict[str, Any]:
        r = _run(index, id)
        text, config = r.config()
        metrics = read_metrics(r.file("metrics.jsonl"))
        summary = r.summary()
        return {
            "row": r.row(metrics, config, summary or {}),
            "config_text": text,
            "config": config,
            "summary": summary,
            "checkpoints": r.checkpoints(),
            "train": metrics.train,
            "evals": metrics.evals,
            "bad_lines": metrics.bad_lines,
            "has_ledger": r.file("ledger.sqlite").is_file(),
        }

    @api.get("/facets")
    def facets(run: str) -> dict[str, Any]:
        view = _ledger(_run(index, run))
        try:
            return view.facets()
        finally:
            view.close()

    @api.get("/rollouts")
    def rollouts(
        run: str,
        step: int | None = None,
        env: str | None = None,
        task: str | None = None,
        status: str | None = None,
        score_min: float | None = None,
        score_max: float | None = None,
        text: str | None = None,
        trained: bool = False,
        offset: int = Query(0, ge=0),
        limit: int = Query(50, ge=1, le=200),
    ) -> dict[str, Any]:
        view = _ledger(_run(index, run))
        filters = Filters(step, env, task, status, score_min, score_max, text, trained)
        try:
            return view.page(filters, offset, limit)
        finally:
            view.close()

    @api.get("/rollout")
    def rollout(run: str, id: int) -> dict[str, Any]:
        r = _run(index, run)
        view = _ledger(r)
        try:
            row = view.rollout(id)
        finally:
            view.close()
        if row is None:
            raise HTTPException(404, f"no rollout {id} in {run}")
        model = r.config()[1].get("model", {}).get("name")
        tokenizer, why = tokenizer_for(model)
        prompt, later = turns(row["messages"])
        return row | {
            "prompt": prompt,
            "turns": later,
            "segments": segments(row, tokenizer),
            "tokens_note": why,
        }

    @api.get("/group")
    def group(run: str, step: int, task: str) -> dict[str, Any]:
        view = _ledger(_run(index, run))
        try:
            rows = view.group(step, task)
        finally:
            view.close()
        if not rows:
            raise HTTPException(404, f"no rollouts of {task!r} at step {step}")
        return {"step": step, "task_id": task, "rows": rows}

    @api.get("/reports")
    def reports() -> dict[str, Any]:
        return {"reports": reports_mod.find_reports(resolved)}

    @api.get("/report")
    def report(id: str) -> dict[str, Any]:
        path = reports_mod.resolve(resolved, id, ".md")
        if path is None or reports_mod.heading(path) is None:
            raise HTTPException(404, f"no report {id!r}")
        return {"id": id, "html": reports_mod.render(path), "plots": reports_mod.plots(path, id)}

    @api.get("/plot")
    def plot(id: str) -> FileResponse:
        path = reports_mod.resolve(resolved, id, ".png")
        if path is None:
            raise HTTPException(404, f"no plot {id!r}")
        return FileResponse(path, media_type="image/png")

    return api


def _static(name: str) -> Path | None:
    if name == "plotly.min.js":
        return _plotly_js()
    path = (STATIC / name).resolve()
    return path if path.is_relative_to(STATIC.resolve()) and path.is_file() else None


def create_app(roots: list[Path] | list[str]) -> FastAPI:
    """The dashboard over these run directories (each a run or a folder of runs)."""
    paths = [Path(r) for r in roots]
    app = FastAPI(title="rldojo dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(api_router(paths))
    media = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        path = _static(name)
        if path is None:
            return JSONResponse({"detail": f"no asset {name!r}"}, status_code=404)
        return FileResponse(path, media_type=media.get(path.suffix, "application/octet-stream"))

    @app.get("/")
    def home() -> FileResponse:
        return FileResponse(STATIC / "runs.html", media_type="text/html")

    for page in PAGES[1:]:
        app.add_api_route(
            f"/{page}",
            lambda page=page: FileResponse(STATIC / f"{page}.html", media_type="text/html"),
            methods=["GET"],
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        text = " ".join(str(exc).split())[:300]
        return JSONResponse({"detail": f"{type(exc).__name__}: {text}"}, status_code=500)

    return app

"""Routes for files and fine-tuning jobs, in OpenAI's shapes.

    POST   /v1/files                          multipart `file` + `purpose=fine-tune`
    GET    /v1/files, /v1/files/{id}, /v1/files/{id}/content;  DELETE /v1/files/{id}
                                              (also a job's results, `fine-tune-results`)
    POST   /v1/fine_tuning/jobs               create (validated here, the grader tried on
                                              the first rows; files at job start)
    GET    /v1/fine_tuning/jobs               newest first; `after` (a job id), `limit`
    GET    /v1/fine_tuning/jobs/{id}
    POST   /v1/fine_tuning/jobs/{id}/cancel | pause | resume
                                              (pause: the run checkpoints its last step)
    GET    /v1/fine_tuning/jobs/{id}/events   newest first; `after` (an event id), `limit`
    GET    /v1/fine_tuning/jobs/{id}/checkpoints

Every route takes the caller's owner (`rldojo.service.app.owner`); another key's objects
are 404 and never listed. State is written to SQLite before the reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from rldojo.service.errors import ApiError, not_found
from rldojo.service.job_spec import parse_create
from rldojo.service.scheduler import Scheduler
from rldojo.service.settings import Owner, ServiceSettings
from rldojo.service.state import TERMINAL, ServiceState, new_id

__all__ = ["file_json", "job_json", "jobs_router", "page"]

ORGANIZATION = "org-rldojo"


def page(
    rows: Sequence[dict[str, Any]],
    after: str | None,
    limit: int,
    to_json: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """OpenAI's cursor page: the rows after the one with id `after`, at most `limit`."""
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit: expected 1 to 100", param="limit")
    start = 0
    if after is not None:
        ids = [r["id"] for r in rows]
        if after not in ids:
            raise ApiError(400, f"after: no such object {after!r}", param="after")
        start = ids.index(after) + 1
    chunk = rows[start : start + limit]
    data = [to_json(r) for r in chunk]
    return {
        "object": "list",
        "data": data,
        "has_more": start + limit < len(rows),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def file_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def job_json(row: dict[str, Any]) -> dict[str, Any]:
    method = row["method"]
    kind = method["type"]
    hyper = dict(row["hyperparameters"] or method[kind]["hyperparameters"])
    hyper.pop("steps", None)
    shown = {
        k: hyper.get(k, "auto") for k in ("batch_size", "learning_rate_multiplier", "n_epochs")
    }
    return {
        "object": "fine_tuning.job",
        "id": row["id"],
        "created_at": row["created_at"],
        "error": row["error"],
        "fine_tuned_model": row["fine_tuned_model"],
        "finished_at": row["finished_at"],
        "hyperparameters": shown,
        "model": row["model"],
        "organization_id": ORGANIZATION,
        "result_files": list(row.get("result_files") or []),
        "seed": row["seed"],
        "status": row["status"],
        "trained_tokens": row["trained_tokens"],
        "training_file": row["training_file"],
        "validation_file": row["validation_file"],
        "estimated_finish": None,
        "integrations": [],
        "metadata": row["metadata"] or None,
        "user_provided_suffix": row["suffix"],
        "method": {"type": kind, kind: {**method[kind], "hyperparameters": hyper}},
    }


def _event_json(row: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in (row["data"] or {}).items() if k != "kind"}
    return {
        "object": "fine_tuning.job.event",
        "id": row["id"],
        "created_at": row["created_at"],
        "level": row["level"],
        "message": row["message"],
        "type": row["type"],
        "data": data,
    }


def _checkpoint_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "object": "fine_tuning.job.checkpoint",
        "id": row["id"],
        "created_at": row["created_at"],
        "fine_tuned_model_checkpoint": row["model"],
        "fine_tuning_job_id": row["job_id"],
        "step_number": row["step"],
        "metrics": row["metrics"],
    }


async def _read_upload(upload: UploadFile, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := await upload.read(1 << 20):
        size += len(chunk)
        if size > limit:
            raise ApiError(
                413,
                f"file: larger than this service's limit of {limit} bytes",
                param="file",
                code="file_too_large",
            )
        chunks.append(chunk)
    return b"".join(chunks)


def jobs_router(
    settings: ServiceSettings, state: ServiceState, scheduler: Scheduler, owner: Owner
) -> APIRouter:
    """The files and jobs routes over `state`; `owner` is the auth dependency."""
    r = APIRouter(prefix="/v1")
    files_dir = settings.data_dir / "files"
    files_dir.mkdir(parents=True, exist_ok=True)

    @r.post("/files")
    async def upload(request: Request, who: str = Depends(owner)) -> dict[str, Any]:
        length = int(request.headers.get("content-length") or 0)
        if length > settings.max_file_bytes + 64 * 1024:  # before reading it at all
            raise ApiError(
                413,
                f"file: larger than this service's limit of {settings.max_file_bytes} bytes",
                param="file",
                code="file_too_large",
            )
        try:
            form = await request.form(max_part_size=settings.max_file_bytes + 1)
        except Exception as exc:  # not multipart, or malformed
            raise ApiError(
                400, f"expected a multipart form with 'file' and 'purpose': {exc}", param="file"
            ) from None
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "fine-tune":
            raise ApiError(400, f"purpose: expected 'fine-tune', got {purpose!r}", param="purpose")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "file: missing (a multipart file part)", param="file")
        content = await _read_upload(upload, settings.max_file_bytes)
        file_id = new_id("file")
        path = files_dir / f"{file_id}.jsonl"
        path.write_bytes(content)
        row = {
            "id": file_id,
            "owner": who,
            "filename": upload.filename or "upload.jsonl",
            "bytes": len(content),
            "purpose": purpose,
            "created_at": int(time.time()),
            "path": str(path),
        }
        state.add_file(row)
        return file_json(row)

    @r.get("/files")
    async def list_files(
        after: str | None = None, limit: int = 100, who: str = Depends(owner)
    ) -> dict[str, Any]:
        return page(state.files(who), after, limit, file_json)

    def _file(who: str, file_id: str) -> dict[str, Any]:
        row = state.file(who, file_id)
        if row is None:
            raise not_found("file", file_id, "file_id")
        return row

    @r.get("/files/{file_id}")
    async def get_file(file_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        return file_json(_file(who, file_id))

    @r.get("/files/{file_id}/content")
    async def file_content(file_id: str, who: str = Depends(owner)) -> Response:
        row = _file(who, file_id)
        with open(row["path"], "rb") as f:
            return Response(f.read(), media_type="application/octet-stream")

    @r.delete("/files/{file_id}")
    async def delete_file(file_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        if not state.delete_file(who, file_id):
            raise not_found("file", file_id, "file_id")
        return {"id": file_id, "object": "file", "deleted": True}

    @r.post("/fine_tuning/jobs")
    async def create_job(request: Request, who: str = Depends(owner)) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        fields = await asyncio.to_thread(parse_create, body, settings, state, who)
        row = {
            "id": new_id("ftjob"),
            "owner": who,
            **fields,
            "status": "validating_files",
            "created_at": int(time.time()),
            "hyperparameters": None,
        }
        state.add_job(row)
        state.add_event(row["id"], f"Created fine-tuning job: {row['id']}")
        return job_json(state.job(who, row["id"]) or row)

    @r.get("/fine_tuning/jobs")
    async def list_jobs(
        after: str | None = None, limit: int = 20, who: str = Depends(owner)
    ) -> dict[str, Any]:
        return page(state.jobs(who), after, limit, job_json)

    def _job(who: str, job_id: str) -> dict[str, Any]:
        row = state.job(who, job_id)
        if row is None:
            raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
        return row

    @r.get("/fine_tuning/jobs/{job_id}")
    async def get_job(job_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        return job_json(_job(who, job_id))

    def _move(
        who: str, job_id: str, to: str, allowed: tuple[str, ...], what: str
    ) -> dict[str, Any]:
        row = _job(who, job_id)
        extra = {"finished_at": int(time.time())} if to in TERMINAL else {}
        if not state.update_job(job_id, status=to, only_from=allowed, **extra):
            current = (state.job(who, job_id) or row)["status"]
            raise ApiError(
                400,
                f"cannot {what} a job that is {current}",
                param="fine_tuning_job_id",
                code="invalid_job_state",
            )
        state.add_event(
            job_id,
            {"cancelled": "Job cancelled", "paused": "Job paused", "queued": "Job resumed: queued"}[
                to
            ],
        )
        if to != "queued":  # the worker is gone when this returns; a pause lets it save
            scheduler.stop(job_id, f"job {to}", graceful=to == "paused")
        return job_json(state.job(who, job_id) or row)

    @r.post("/fine_tuning/jobs/{job_id}/cancel")
    def cancel(job_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        return _move(
            who, job_id, "cancelled", ("validating_files", "queued", "running", "paused"), "cancel"
        )

    @r.post("/fine_tuning/jobs/{job_id}/pause")
    def pause(job_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        return _move(who, job_id, "paused", ("queued", "running"), "pause")

    @r.post("/fine_tuning/jobs/{job_id}/resume")
    def resume(job_id: str, who: str = Depends(owner)) -> dict[str, Any]:
        return _move(who, job_id, "queued", ("paused",), "resume")

    @r.get("/fine_tuning/jobs/{job_id}/events")
    async def events(
        job_id: str, after: str | None = None, limit: int = 20, who: str = Depends(owner)
    ) -> dict[str, Any]:
        _job(who, job_id)
        return page(state.events(job_id), after, limit, _event_json)

    @r.get("/fine_tuning/jobs/{job_id}/checkpoints")
    async def checkpoints(
        job_id: str, after: str | None = None, limit: int = 10, who: str = Depends(owner)
    ) -> dict[str, Any]:
        _job(who, job_id)
        return page(state.checkpoints(job_id), after, limit, _checkpoint_json)

    return r

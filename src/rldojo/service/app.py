"""The service's FastAPI app: auth, error shapes, and the routers, over one data dir.

`build_service(settings)` returns a `Service` (the app, its state, scheduler and model
cache); `Service.start()` starts the scheduler, `Service.close()` stops it and kills
running job workers (their jobs stay `running` in SQLite and resume on the next start).

Auth: ``Authorization: Bearer KEY`` with a key from `settings.api_keys`, else 401 with
OpenAI's `invalid_api_key` body. Every error, validation errors of request bodies
included, has OpenAI's shape (`rldojo.service.errors`); an unexpected exception is a
500 with the same shape (and a logged traceback), never a hung request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rldojo.inference.protocol import RequestError
from rldojo.service.api_jobs import jobs_router
from rldojo.service.api_models import EngineCache, models_router
from rldojo.service.errors import ApiError, error_body
from rldojo.service.scheduler import Scheduler
from rldojo.service.settings import ServiceSettings, owner_of
from rldojo.service.state import ServiceState

__all__ = ["Service", "build_service"]

log = logging.getLogger("rldojo.service")


@dataclass
class Service:
    app: FastAPI
    settings: ServiceSettings
    state: ServiceState
    scheduler: Scheduler
    engines: EngineCache

    def start(self) -> None:
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.close()
        self.engines.close()
        self.state.close()


def build_service(settings: ServiceSettings) -> Service:
    state = ServiceState(settings.data_dir)
    scheduler = Scheduler(settings, state)
    engines = EngineCache(settings.max_loaded_models)
    owners = {owner_of(k) for k in settings.api_keys}

    def owner(request: Request) -> str:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        who = owner_of(key) if key else ""
        if who not in owners:
            raise ApiError(
                401,
                "Incorrect API key provided (Authorization: Bearer KEY)",
                code="invalid_api_key",
            )
        return who

    app = FastAPI(title="rldojo service", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestError)  # the engine refused it (e.g. past its context)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        body = error_body(400, f"{exc.param}: {exc}", exc.param, exc.code)
        return JSONResponse(body, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if p not in ("body", "query"))
        return JSONResponse(error_body(400, f"{where}: {err['msg']}", where), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "running_jobs": len(scheduler.running())}

    app.include_router(jobs_router(settings, state, scheduler, owner))
    app.include_router(models_router(settings, state, owner, engines))
    return Service(app, settings, state, scheduler, engines)

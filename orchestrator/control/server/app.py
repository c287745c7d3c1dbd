"""`baton serve`: the REST API and the run-centric web UI, one ASGI application.

The API is read-only but for the control verbs (`cancel`, `resume`, and a gate's `approve` and
`reject`: `server.gates`), which need a
credential with the control scope (see `auth`). Every answer comes from the run store, so a
run that ended before the server started reads like any other. Errors are JSON —
`{"error": {"status": 404, "message": "..."}}` — and the OpenAPI document is at
`/api/openapi.json`. The UI is static files shipped in the package (no CDN: installs happen
offline) that read the same API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field, TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import StreamingResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from orchestrator.control import inspection
from orchestrator.control.budget_view import budget_json, budget_line, spend_of_each
from orchestrator.control.fleet import unserved_queue
from orchestrator.control.inspection import Artifact, EntryPage, RunPage, Span, Tokens
from orchestrator.control.server.auth import (
    ANONYMOUS_CONTROL,
    CSRF_HEADER,
    SESSION_COOKIE,
    Authenticator,
    Principal,
    ServeSettings,
)
from orchestrator.control.server.gates import gate_routes
from orchestrator.control.server.limits import LoginLimiter
from orchestrator.control.server.login import login_routes
from orchestrator.control.server.sessions import Sessions
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import (
    ArtifactNotFoundError,
    BatonError,
    PipelineError,
    RunNotFoundError,
    RunStateError,
)
from orchestrator.core.models import ArtifactRef, GateRecord, Issue, RunStatus, StageRecord
from orchestrator.core.store import RunStore

logger = logging.getLogger(__name__)

STATIC = Path(str(resources.files("orchestrator.control.server") / "static"))
API = "/api/v1"
SAFE_MEDIA_TYPES = {"text/plain", "text/x-diff", "application/json"}
"""Artifacts are served as one of these or as bytes to download: never as HTML a browser would
run."""
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    ),
}


class RunView(BaseModel):
    """A run with everything recorded about its stages."""

    summary: inspection.RunSummary
    pipeline_hash: str | None
    """The SHA-256 of the pipeline spec the run pinned."""
    unserved_queue: str | None
    """The queue its current stage waits in, when no worker serves it."""
    commit: str
    environment: str | None
    issue: Issue
    stages: dict[str, StageRecord]
    gates: dict[str, GateRecord]
    """Its gates by id: what waits for a person's decision, and what was decided."""
    outputs: list[str]
    """The names of its recorded outputs (`fix`, `fix.1`, …)."""
    change: str | None
    """The artifact holding its change (`pr/workspace.diff`), if it made one."""
    budget: dict[str, Any] | None = None
    """Its spend beside each limit of its budget (`status --json`'s `budget`); None: it has
    no budget."""
    budget_line: str | None = None
    """The same in one line, as `baton status` prints it."""


class Me(BaseModel):
    name: str
    scope: str
    flower_url: str | None


class CancelReply(BaseModel):
    run_id: str
    status: RunStatus


class ResumeRequest(BaseModel):
    from_stage: str | None = Field(default=None, max_length=200)
    """Run again from this stage (default: the one that failed or was cancelled)."""


class ResumeReply(BaseModel):
    run_id: str
    resumed_from: str


class ErrorBody(BaseModel):
    status: int
    message: str


class ErrorReply(BaseModel):
    error: ErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorReply} for code in (401, 403, 404, 409, 413, 422)
}


def principal(request: Request) -> Principal:
    """Who sends the request: a bearer token's holder, a session's user, or (without auth)
    anyone with every right. 401 otherwise."""
    if not request.app.state.auth_required:
        return ANONYMOUS_CONTROL
    authenticator: Authenticator = request.app.state.authenticator
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        found = authenticator.bearer(token.strip())
        if found is None:
            raise HTTPException(401, "the bearer token is not valid")
        return found
    sessions: Sessions = request.app.state.sessions
    found = sessions.principal(request.cookies.get(SESSION_COOKIE))
    if found is None:
        raise HTTPException(401, "log in, or send a bearer token")
    return found


Viewer = Annotated[Principal, Depends(principal)]


def controller(request: Request, who: Viewer) -> Principal:
    """Who sends a request that changes a run: it needs the control scope and, with a session
    cookie, the header only the UI's own scripts send."""
    if not who.may_control:
        raise HTTPException(403, f"{who.name} may look but not control runs")
    if who.via == "session" and CSRF_HEADER.lower() not in request.headers:
        raise HTTPException(403, f"a change made with a session needs the {CSRF_HEADER} header")
    return who


Controller = Annotated[Principal, Depends(controller)]


def create_app(
    conductor: Conductor, settings: ServeSettings, *, auth_required: bool = True
) -> FastAPI:
    """The application on `conductor`'s store. With `auth_required` False every request may
    do everything (`baton serve --no-auth`, for a trusted network). The client's address and
    scheme are the connection's, or those the proxies of `settings.forwarded_allow_ips` say."""
    authenticator = Authenticator(settings)
    sessions = Sessions(conductor.store.redis, authenticator, settings.session_hours * 3600)
    app = FastAPI(
        title="Baton",
        summary="Runs of Baton's agent pipelines: their stages, outputs, artifacts and audit.",
        version="1",
        openapi_url="/api/openapi.json",
        docs_url=None,  # Swagger UI's assets come from a CDN
        redoc_url=None,
        responses=ERRORS,
    )
    app.state.authenticator = authenticator
    app.state.sessions = sessions
    app.state.auth_required = auth_required
    app.include_router(_service(conductor.store, settings))
    app.include_router(_reads(conductor.store))
    app.include_router(_artifacts(conductor.store))
    app.include_router(_control(conductor))
    app.include_router(gate_routes(conductor, API, controller))
    app.include_router(_pages())
    limiter = LoginLimiter(conductor.store.redis, settings)
    app.include_router(login_routes(STATIC / "login.html", authenticator, sessions, limiter,
                                    settings))  # fmt: skip
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _handle_errors(app)

    @app.middleware("http")
    async def headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """The security headers, and `Server-Timing`: the time the server took to answer (to
        the start of a streamed body), which browsers' developer tools and `make bench` read."""
        started = time.perf_counter()
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        took_ms = (time.perf_counter() - started) * 1000
        response.headers["Server-Timing"] = f"app;dur={took_ms:.1f}"
        return response

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    if settings.forwarded_allow_ips:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.forwarded_allow_ips)
    return app


def _service(store: RunStore, settings: ServeSettings) -> APIRouter:
    """The service's own: its health (for probes) and who is asking."""
    app = APIRouter()

    @app.get(f"{API}/health", tags=["service"])
    def health() -> dict[str, str]:
        """Answers without a login (for probes): `ok` when Redis answers, else 503."""
        try:
            store.redis.ping()
        except redis.RedisError as exc:
            raise HTTPException(503, f"Redis does not answer: {type(exc).__name__}") from exc
        return {"status": "ok"}

    @app.get(f"{API}/me", tags=["service"])
    def me(who: Viewer) -> Me:
        """Who the credential is and what it may do; where Flower is."""
        return Me(name=who.name, scope=who.scope, flower_url=settings.flower_url)

    return app


def _reads(store: RunStore) -> APIRouter:
    """The API's reads: runs, their stages, outputs, time lines, tokens and audit."""
    app = APIRouter()
    run_of = store.get

    @app.get(f"{API}/runs", tags=["runs"])
    def list_runs(
        _: Viewer,
        status: RunStatus | None = None,
        pipeline: Annotated[str | None, Query(max_length=200)] = None,
        repo: Annotated[str | None, Query(max_length=2000)] = None,
        q: Annotated[
            str | None,
            Query(max_length=200, description="Text in the run id, issue title or repository."),
        ] = None,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> RunPage:
        """Runs, the newest first, filtered by every parameter given."""
        return inspection.find_runs(
            store, status=status, pipeline=pipeline, repo=repo, text=q, offset=offset,
            limit=limit,
        )  # fmt: skip

    @app.get(f"{API}/runs/{{run_id}}", tags=["runs"])
    def get_run(run_id: str, _: Viewer) -> RunView:
        """A run: its issue, each stage's record (status, attempts, iterations, timings,
        tokens, waits, artifacts) and the names of its outputs."""
        run = run_of(run_id)
        ref = inspection.change(run)
        spend = spend_of_each(store, [run]).get(run.id)
        return RunView(
            summary=inspection.summarize(run),
            pipeline_hash=run.pipeline_hash,
            unserved_queue=unserved_queue(store, run),
            commit=run.commit,
            environment=run.environment,
            issue=run.issue,
            stages=run.stages,
            gates=run.gates,
            outputs=inspection.output_names(store, run),
            change=ref.name if ref else None,
            budget=budget_json(run, spend),
            budget_line=budget_line(run, spend),
        )

    @app.get(f"{API}/runs/{{run_id}}/outputs/{{key}}", tags=["runs"])
    def get_output(run_id: str, key: str, _: Viewer) -> dict[str, Any]:
        """One stage's output as recorded (`fix`, or `fix.1` for one iteration)."""
        return inspection.output(store, run_of(run_id), key)

    @app.get(f"{API}/runs/{{run_id}}/timeline", tags=["runs"], response_model=list[Span])
    def get_timeline(run_id: str, _: Viewer) -> Response:
        """Each stage's time queued, running (per iteration) and waiting on a rate limit."""
        run = run_of(run_id)
        waits = inspection.whole_audit(store, run_id, kinds=inspection.WAITS)
        return _json(_SPANS.dump_json(inspection.timeline(run, waits)))

    @app.get(f"{API}/runs/{{run_id}}/tokens", tags=["runs"], response_model=Tokens)
    def get_tokens(run_id: str, _: Viewer) -> Response:
        """Where the tokens went: per stage and per model call."""
        run = run_of(run_id)
        turns = inspection.whole_audit(store, run_id, kinds=inspection.MODEL_TURNS)
        return _json(inspection.tokens(run, turns).model_dump_json())

    @app.get(f"{API}/runs/{{run_id}}/audit", tags=["runs"], response_model=EntryPage)
    def get_audit(
        run_id: str,
        _: Viewer,
        stage: Annotated[str | None, Query(max_length=200)] = None,
        after: Annotated[str | None, Query(pattern=r"^\d+-\d+$")] = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    ) -> Response:
        """The audit stream read as a transcript, oldest first, `limit` entries after the
        entry `after`; with `stage`, only that stage's sessions."""
        if not store.exists(run_id):
            raise RunNotFoundError(run_id)
        page = inspection.read_audit(store, run_id, stage=stage, after=after, limit=limit)
        return _json(page.model_dump_json())

    return app


def _artifacts(store: RunStore) -> APIRouter:
    """The API's artifacts, streamed."""
    app = APIRouter()
    run_of = store.get

    @app.get(f"{API}/runs/{{run_id}}/artifacts", tags=["artifacts"])
    def list_artifacts(run_id: str, _: Viewer) -> list[Artifact]:
        """Every artifact the run's stages recorded: test logs, diffs, build logs."""
        return inspection.artifacts(run_of(run_id))

    @app.get(
        f"{API}/runs/{{run_id}}/artifacts/{{name:path}}",
        tags=["artifacts"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def get_artifact(run_id: str, name: str, _: Viewer, download: bool = False) -> Response:
        """The artifact's bytes, streamed (never read whole into the server's memory)."""
        return _stream(store, inspection.find_artifact(run_of(run_id), name), download)

    @app.get(
        f"{API}/runs/{{run_id}}/diff",
        tags=["artifacts"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/x-diff": {}}}},
    )
    def get_diff(run_id: str, _: Viewer) -> Response:
        """The run's change: the published diff, or the fix's."""
        run = run_of(run_id)
        ref = inspection.change(run)
        if ref is None:
            raise ArtifactNotFoundError(f"run {run_id} has made no change")
        return _stream(store, ref, download=False)

    return app


def _control(conductor: Conductor) -> APIRouter:
    """The API's control verbs, for credentials with the control scope."""
    app = APIRouter()
    run_of = conductor.store.get

    @app.post(f"{API}/runs/{{run_id}}/cancel", tags=["control"])
    def cancel(run_id: str, who: Controller) -> CancelReply:
        """Cancel a run: its running stage stops at its next safe point. 409 if it ended."""
        if not conductor.cancel(run_id, f"cancelled by {who.name}"):
            ended = run_of(run_id).status.value
            raise RunStateError(f"run {run_id} had already ended ({ended})")
        logger.info("run %s cancelled by %s", run_id, who.name)
        return CancelReply(run_id=run_id, status=run_of(run_id).status)

    @app.post(f"{API}/runs/{{run_id}}/resume", tags=["control"])
    def resume(run_id: str, who: Controller, body: ResumeRequest | None = None) -> ResumeReply:
        """Run a failed or cancelled run again from the stage that did not finish (or
        `from_stage`), keeping every output recorded before it."""
        stage = conductor.resume(run_id, body.from_stage if body else None)
        logger.info("run %s resumed from %s by %s", run_id, stage, who.name)
        return ResumeReply(run_id=run_id, resumed_from=stage)

    return app


def _handle_errors(app: FastAPI) -> None:
    """Every error as JSON with a message; Baton's own errors by the status they mean; a page
    of the UI asked for without a login goes to the login page."""

    statuses: list[tuple[type[Exception], int]] = [
        (RunNotFoundError, 404), (ArtifactNotFoundError, 404), (RunStateError, 409),
        (PipelineError, 422), (BatonError, 400),
    ]  # fmt: skip

    async def baton_error(request: Request, exc: Exception) -> Response:
        code = next(code for kind, code in statuses if isinstance(exc, kind))
        return _error(code, str(exc))

    for kind, _code in statuses:
        app.add_exception_handler(kind, baton_error)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 401 and not request.url.path.startswith("/api/"):
            return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _error(exc.status_code, str(exc.detail), headers)

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _error(422, f"invalid request: {problems}")

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_request)


def _pages() -> APIRouter:
    """The web UI's pages: static files that read the API (the login's are in `login`)."""
    app = APIRouter(include_in_schema=False)

    @app.get("/", include_in_schema=False)
    def runs_page(_: Viewer) -> Response:
        return FileResponse(STATIC / "runs.html")

    @app.get("/runs/{run_id}", include_in_schema=False)
    def run_page(run_id: str, _: Viewer) -> Response:
        return FileResponse(STATIC / "run.html")

    return app


def _stream(store: RunStore, ref: ArtifactRef, download: bool) -> Response:
    size, chunks = inspection.read_artifact(store, ref)  # raises now if it is gone
    media = ref.media_type if ref.media_type in SAFE_MEDIA_TYPES else "application/octet-stream"
    if media.startswith("text/"):
        media += "; charset=utf-8"
    filename = ref.name.rpartition("/")[2]
    disposition = "attachment" if download or media == "application/octet-stream" else "inline"
    return StreamingResponse(
        chunks,
        media_type=media,
        headers={
            "Content-Length": str(size),
            "Content-Disposition": f'{disposition}; filename="{quote(filename)}"',
            "ETag": f'"{ref.sha256}"',
        },
    )


_SPANS = TypeAdapter(list[Span])


def _json(body: str | bytes) -> Response:
    """A body already serialised from its model: FastAPI would validate a returned model
    against the route's response model once more, which for a page of 2,000 audit entries costs
    as much as reading them."""
    return Response(body, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = ErrorReply(error=ErrorBody(status=status, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


class BodyLimit:
    """Refuses a request whose body is over `limit` bytes with a 413, before the application
    reads it: by its Content-Length, or, sent in chunks, as soon as it passes the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _refuse(send, self.limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _refuse(send, self.limit)


class _TooLarge(Exception):
    pass


async def _refuse(send: Send, limit: int) -> None:
    response = _error(413, f"the request body is over {limit:,} bytes")
    await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})

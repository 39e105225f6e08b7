"""The inspector's Starlette app: the runs page, a run's page and the JSON its live view polls.

Read-only by construction: every route is a GET and calls only the store's read methods
(`list_runs`, `read`, `head`). Pages are rendered on the server by Jinja2 with autoescaping on,
so every stored value (run ids, attributes, payloads, errors) reaches the browser as text; a
Content-Security-Policy allows only the app's own script and stylesheet, a second line of defence
should a value ever slip through unescaped.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runfold.kernel import (
    LIVE_RUN_STATUSES,
    CorruptEvent,
    HistoryError,
    RunNotSupported,
    RunStatus,
    project_run,
)
from runfold.kernel.naming import step_names
from runfold.stores import EventStore, open_store
from runfold.ui.history import history_entry, hook_status, short_text, timestamp
from runfold.ui.payloads import show_payload
from runfold.ui.timeline import build_timeline

__all__ = ["LOOPBACK_HOSTS", "create_app", "open_read_store"]

RUN_STATUSES: tuple[str, ...] = typing.get_args(RunStatus)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
"""Host names the app answers to when bound to loopback (a guard against DNS rebinding)."""
RUNS_PAGE = 25
HISTORY_PAGE = 50
MAX_PAGE = 500
COUNT_CAP = 10_000
"""Counting runs by status stops after this many runs (the page then says "at least")."""
POLL_MS = 1000
"""How often a live run's page asks whether the run has new events."""

_HERE = Path(__file__).parent
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class _SecurityHeaders:
    """Add the CSP and friends to every response (pure ASGI: no buffering of bodies)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,  # every {{ value }} is HTML-escaped, whatever the template's name
        undefined=jinja2.StrictUndefined,
    )
    env.filters["urlpart"] = lambda value: quote(str(value), safe="")
    env.filters["payload"] = show_payload
    env.filters["when"] = timestamp
    env.filters["short"] = short_text
    env.filters["hook_status"] = hook_status
    return Jinja2Templates(env=env)


async def open_read_store(store_url: str) -> EventStore:
    """Open the store at `store_url` for reading, changing nothing in it.

    `open_store(..., read_only=True)`: a SQLite file is opened read-only (a path with no file
    is a `StoreOpenError`, not a new store), and a PostgreSQL schema is not migrated, so a role
    with only `SELECT` rights can inspect it; a schema that needs migrating is a
    `StoreOpenError`.
    """
    return await open_store(store_url, read_only=True)


def _limit(request: Request, default: int) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise _BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}, not {text!r}")
    return int(text)


class _BadRequest(Exception):
    """A query parameter the page cannot use; shown as a 400 page naming it."""


def create_app(
    store_url: str, *, allowed_hosts: typing.Sequence[str] = LOOPBACK_HOSTS
) -> Starlette:
    """The inspector's ASGI app over the store at `store_url`, opened when the app starts.

    `allowed_hosts` are the `Host` headers it answers to (`["*"]` for any); the default suits a
    server bound to loopback.
    """
    templates = _templates()
    store: EventStore | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal store
        store = await open_read_store(store_url)
        try:
            yield
        finally:
            await store.close()

    def the_store() -> EventStore:
        assert store is not None, "the app's lifespan opens the store"
        return store

    def error_page(request: Request, status: int, message: str) -> Response:
        return templates.TemplateResponse(
            request, "error.html", {"status": status, "message": message}, status_code=status
        )

    async def runs(request: Request) -> Response:
        params = request.query_params
        status = params.get("status") or None
        workflow = params.get("workflow") or None
        parent = params.get("parent") or None
        cursor = params.get("cursor") or None
        try:
            limit = _limit(request, RUNS_PAGE)
            if status is not None and status not in RUN_STATUSES:
                raise _BadRequest(f"unknown status {status!r} (one of {', '.join(RUN_STATUSES)})")
            try:
                page = await the_store().list_runs(
                    workflow_name=workflow,
                    status=typing.cast(RunStatus | None, status),
                    parent_run_id=parent,
                    cursor=cursor,
                    limit=limit,
                )
            except ValueError as exc:  # a cursor this store did not make
                raise _BadRequest(str(exc)) from None
        except _BadRequest as exc:
            return error_page(request, 400, str(exc))
        counts, capped = await _count_by_status(the_store(), workflow, parent)
        filters = {"workflow": workflow, "parent": parent, "limit": params.get("limit")}

        def query(**changes: str | None) -> str:
            merged = {**filters, "status": status, **changes}
            encoded = urlencode({k: v for k, v in merged.items() if v})
            return f"/?{encoded}" if encoded else "/"

        return templates.TemplateResponse(
            request,
            "runs.html",
            {
                "page": page,
                "status": status,
                "workflow": workflow,
                "parent": parent,
                "cursor": cursor,
                "statuses": RUN_STATUSES,
                "counts": counts,
                "total": sum(counts.values()),
                "capped": capped,
                "query": query,
            },
        )

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            limit = _limit(request, HISTORY_PAGE)
            after_text = request.query_params.get("after", "0")
            if not after_text.isdigit():
                raise _BadRequest(f"after must be a sequence number, not {after_text!r}")
        except _BadRequest as exc:
            return error_page(request, 400, str(exc))
        after = int(after_text)
        store = the_store()
        history = await store.read(run_id)
        if not history:
            return error_page(request, 404, f"no run {run_id!r} in this store")
        try:
            snapshot = project_run(history)
        except (HistoryError, RunNotSupported, CorruptEvent) as exc:
            return error_page(request, 500, f"the run's history cannot be read: {exc}")
        live = snapshot.status in LIVE_RUN_STATUSES
        start = history[0].recorded_at
        shown = [e for e in history if e.sequence > after][:limit]
        steps = step_names(history)
        return templates.TemplateResponse(
            request,
            "run.html",
            {
                "run": snapshot,
                "live": live,
                "timeline": build_timeline(history, now=datetime.now(UTC) if live else None),
                "entries": [history_entry(e, start, steps) for e in shown],
                "after": after,
                "limit": limit,
                "previous_after": max(after - limit, 0) if after > 0 else None,
                "next_after": shown[-1].sequence
                if shown and shown[-1].sequence < snapshot.last_sequence
                else None,
                "poll_ms": POLL_MS,
            },
        )

    async def head(request: Request) -> Response:
        run_id = request.query_params.get("run_id", "")
        store = the_store()
        last = await store.head(run_id)
        if last == 0:
            return JSONResponse({"error": "no such run"}, status_code=404)
        summary = (await store.get_runs([run_id]))[0]
        return JSONResponse(
            {"last_sequence": last, "status": summary.status if summary is not None else None}
        )

    return Starlette(
        routes=[
            Route("/", runs),
            Route("/runs/{run_id:path}", run),
            Route("/api/head", head),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
        ],
        lifespan=lifespan,
    )


async def _count_by_status(
    store: EventStore, workflow: str | None, parent: str | None
) -> tuple[dict[str, int], bool]:
    """Runs by status among those the filters (but status) select; True if `COUNT_CAP` hit."""
    counts = dict.fromkeys(RUN_STATUSES, 0)
    seen = 0
    cursor: str | None = None
    while True:
        page = await store.list_runs(
            workflow_name=workflow, parent_run_id=parent, cursor=cursor, limit=MAX_PAGE
        )
        for summary in page.items:
            counts[summary.status] += 1
        seen += len(page.items)
        if not page.has_more or page.cursor is None:
            return counts, False
        if seen >= COUNT_CAP:
            return counts, True
        cursor = page.cursor

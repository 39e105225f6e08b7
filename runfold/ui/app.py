"""The inspector's Starlette app: the runs page, a run's page and the JSON its live view polls.

Read-only unless told otherwise: every page is a GET and calls only the store's read methods
(`list_runs`, `get_runs`, `read`, `read_by_correlation`, `head`); the operator actions
(`allow_actions`, `runfold.ui.actions`) are the only POSTs, and exist only when asked for.
A run's page is its first screen (index row and a page of history) and a details fragment the
page fetches (`runfold.ui.details`): neither grows with the run. Pages are rendered on the
server by Jinja2 with autoescaping on, so every stored value (run ids, attributes, payloads,
errors) reaches the browser as text; a Content-Security-Policy allows only the app's own script
and stylesheet, a second line of defence should a value ever slip through unescaped.
"""

from __future__ import annotations

import secrets
import time
import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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

from runfold.cli.values import hook_status, timestamp
from runfold.kernel import (
    LIVE_RUN_STATUSES,
    CorruptEvent,
    HistoryError,
    RunNotSupported,
    RunStatus,
    RunSummary,
)
from runfold.kernel.naming import step_names
from runfold.stores import EventStore, open_store
from runfold.ui.details import DELIVERIES_SHOWN, TABLES, run_details
from runfold.ui.history import history_entry, payload_limit_for
from runfold.ui.payloads import LISTED_LIMIT, show_payload
from runfold.ui.rendered import Recent, RenderedPages
from runfold.ui.snapshots import SnapshotCache

if typing.TYPE_CHECKING:
    from runfold.ui.actions import Actions

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
    # Same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with a
    # form's POST, and the operator actions check that header (`runfold.ui.actions`).
    (b"referrer-policy", b"same-origin"),
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
    env.filters["listed"] = lambda payload: show_payload(payload, LISTED_LIMIT)
    env.filters["clip"] = lambda text: (
        text if len(text) <= LISTED_LIMIT else text[:LISTED_LIMIT] + "…"
    )
    env.filters["when"] = timestamp
    env.filters["hook_status"] = lambda hook, run: hook_status(run, hook)
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


def _offsets(request: Request) -> dict[str, int]:
    """Where each table of a run's page starts (`steps_from=40` …), 0 when not given."""
    offsets = {}
    for name in TABLES:
        text = request.query_params.get(f"{name}_from", "0")
        if not text.isdigit() or len(text) > 9:
            raise _BadRequest(f"{name}_from must be a row number, not {text!r}")
        offsets[name] = int(text)
    return offsets


class _BadRequest(Exception):
    """A query parameter the page cannot use; shown as a 400 page naming it."""


def create_app(
    store_url: str,
    *,
    allowed_hosts: typing.Sequence[str] = LOOPBACK_HOSTS,
    allow_actions: bool = False,
    runtime: str | None = None,
) -> Starlette:
    """The inspector's ASGI app over the store at `store_url`, opened when the app starts.

    `allowed_hosts` are the `Host` headers it answers to (`["*"]` for any); the default suits a
    server bound to loopback. With `allow_actions`, run pages offer cancel and deliver (and
    resume, given `runtime`, a `MODULE:FACTORY` as `runfold resume --runtime` takes), behind
    the checks of `runfold.ui.actions`; the store is then also opened for writing.
    """
    templates = _templates()
    store: EventStore | None = None
    writable: EventStore | None = None
    snapshots: SnapshotCache | None = None
    key = secrets.token_bytes(32)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal store, snapshots, writable
        store = await open_read_store(store_url)
        snapshots = SnapshotCache(store)
        try:
            if actions is not None:
                writable = await open_store(store_url)
                if runtime is not None:
                    from runfold.cli.runtimes import load_runtime

                    actions.runtime = load_runtime(runtime, writable)
            yield
        finally:
            await store.close()
            if writable is not None:
                await writable.close()

    def the_writable() -> EventStore:
        assert writable is not None, "the app's lifespan opens the store"
        return writable

    def session_part(request: Request) -> tuple[str, ...]:
        """What a rendered page's key adds for its session: its forms carry its token."""
        return (request.state.csrf,) if actions is not None else ()

    def operator(request: Request) -> dict[str, typing.Any]:
        """What every template sees of the actions: whether they are on, and the token."""
        if actions is None:
            return {"actions": False, "csrf": "", "can_resume": False}
        return {
            "actions": True,
            "csrf": request.state.csrf,
            "can_resume": actions.runtime is not None,
        }

    templates.context_processors.append(operator)

    def the_store() -> EventStore:
        assert store is not None, "the app's lifespan opens the store"
        return store

    rendered = RenderedPages()
    recent_counts: Recent[tuple[dict[str, int], bool]] = Recent()

    def the_snapshots() -> SnapshotCache:
        assert snapshots is not None, "the app's lifespan opens the store"
        return snapshots

    def error_page(request: Request, status: int, message: str) -> Response:
        return templates.TemplateResponse(
            request, "error.html", {"status": status, "message": message}, status_code=status
        )

    actions: Actions | None = None
    if allow_actions:  # imported only then: the actions bring the engine and the CLI's helpers
        from runfold.ui.actions import Actions, SessionGuard

        actions = Actions(the_writable, key, None, error_page)

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
        counts, capped = await recent_counts.get(
            (workflow, parent), lambda: _count_by_status(the_store(), workflow, parent)
        )
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

    def history_page(request: Request) -> tuple[int, int]:
        limit = _limit(request, HISTORY_PAGE)
        after_text = request.query_params.get("after", "0")
        if not after_text.isdigit():
            raise _BadRequest(f"after must be a sequence number, not {after_text!r}")
        return int(after_text), limit

    async def run(request: Request) -> Response:
        """The first screen: the run's index row, its first event and a page of its history;
        the details (tables, timeline) come from `details`, which the page fetches."""
        run_id = request.path_params["run_id"]
        try:
            after, limit = history_page(request)
            offsets = _offsets(request)
        except _BadRequest as exc:
            return error_page(request, 400, str(exc))
        store = the_store()
        [summary] = await store.get_runs([run_id])
        if summary is None:
            return error_page(request, 404, f"no run {run_id!r} in this store")
        version = (summary.created_at, summary.last_sequence)  # a run made again differs
        key = ("run", run_id, after, limit, tuple(offsets.items()), version, *session_part(request))
        return await rendered.get(key, lambda: render_run(request, summary, after, limit, offsets))

    async def render_run(
        request: Request, summary: RunSummary, after: int, limit: int, offsets: dict[str, int]
    ) -> Response:
        run_id = summary.run_id
        store = the_store()
        try:
            shown = await store.read(run_id, after=after, limit=limit)
        except CorruptEvent as exc:
            return error_page(request, 500, f"the run's history cannot be read: {exc}")
        try:
            first = shown[:1] if after == 0 else await store.read(run_id, limit=1)
        except CorruptEvent as exc:
            return error_page(request, 500, f"the run's history cannot be read: {exc}")
        if not first:  # deleted since its index row was read
            return error_page(request, 404, f"no run {run_id!r} in this store")
        start = first[0].recorded_at
        cut = payload_limit_for(limit)
        last = shown[-1].sequence if shown else after
        details_query = urlencode({f"{name}_from": n for name, n in offsets.items() if n})
        # Steps created on this page are labelled by name (`charge #2`); the details fragment
        # labels every step of the run.
        steps = step_names(shown)
        return templates.TemplateResponse(
            request,
            "run.html",
            {
                "run": summary,
                "live": summary.status in LIVE_RUN_STATUSES,
                "details_url": f"/runs/{quote(run_id, safe='')}/details"
                + (f"?{details_query}" if details_query else ""),
                "entries": [history_entry(e, start, steps, payload_limit=cut) for e in shown],
                "after": after,
                "limit": limit,
                "last_shown": last,
                "at_tail": last >= summary.last_sequence,
                "previous_after": max(after - limit, 0) if after > 0 else None,
                "next_after": last if shown and last < summary.last_sequence else None,
                "poll_ms": POLL_MS,
            },
        )

    async def details(request: Request) -> Response:
        """The run's details, a fragment: header fields of its snapshot, the shown page of each
        table and their timeline; bounded, however long the run."""
        run_id = request.path_params["run_id"]
        try:
            offsets = _offsets(request)
        except _BadRequest as exc:
            return error_page(request, 400, str(exc))
        [summary] = await the_store().get_runs([run_id])
        version = (summary.created_at, summary.last_sequence) if summary else None
        # A live run's timeline reaches "now": its details are kept for the second only.
        key = ("details", run_id, tuple(offsets.items()), version, int(time.time()))
        live = summary is not None and summary.status in LIVE_RUN_STATUSES
        return await rendered.get(
            key if live else key[:-1],
            lambda: render_details(request, run_id, offsets, summary),
            family=("details", run_id, tuple(offsets.items()), version) if live else None,
        )

    async def render_details(
        request: Request, run_id: str, offsets: dict[str, int], summary: RunSummary | None
    ) -> Response:
        created_at = summary.created_at if summary is not None else None
        try:
            snapshot = await the_snapshots().get(run_id, created_at=created_at)
        except (HistoryError, RunNotSupported, CorruptEvent) as exc:
            return error_page(request, 500, f"the run's history cannot be read: {exc}")
        if snapshot is None:
            return error_page(request, 404, f"no run {run_id!r} in this store")
        found = await run_details(the_store(), snapshot, offsets)
        page_url = f"/runs/{quote(run_id, safe='')}"

        def table_url(name: str, first: int) -> str:
            moved = {f"{table}_from": n for table, n in {**offsets, name: first}.items() if n}
            return f"{page_url}?{urlencode(moved)}" if moved else page_url

        return templates.TemplateResponse(
            request,
            "details.html",
            {
                "run": found.run,
                "live": found.live,
                "timeline": found.timeline,
                "tables": found.tables,
                "deliveries_shown": DELIVERIES_SHOWN,
                "table_url": table_url,
            },
        )

    async def events(request: Request) -> Response:
        """History rows after `after`, a fragment: what a live page appends, nothing more."""
        run_id = request.path_params["run_id"]
        try:
            after, limit = history_page(request)
        except _BadRequest as exc:
            return error_page(request, 400, str(exc))
        [summary] = await the_store().get_runs([run_id])
        if summary is None:
            return error_page(request, 404, f"no run {run_id!r} in this store")
        version = (summary.created_at, summary.last_sequence)
        return await rendered.get(
            ("events", run_id, after, limit, version),
            lambda: render_events(request, run_id, after, limit),
        )

    async def render_events(request: Request, run_id: str, after: int, limit: int) -> Response:
        store = the_store()
        try:
            first = await store.read(run_id, limit=1)
            shown = await store.read(run_id, after=after, limit=limit)
        except CorruptEvent as exc:
            return error_page(request, 500, f"the run's history cannot be read: {exc}")
        if not first:
            return error_page(request, 404, f"no run {run_id!r} in this store")
        start = first[0].recorded_at
        cut = payload_limit_for(limit)
        return templates.TemplateResponse(
            request,
            "events.html",
            {"entries": [history_entry(e, start, payload_limit=cut) for e in shown]},
        )

    async def head(request: Request) -> Response:
        run_id = request.query_params.get("run_id", "")
        store = the_store()
        last = await store.head(run_id)
        if last == 0:
            return JSONResponse({"error": "no such run"}, status_code=404)
        summary = (await store.get_runs([run_id]))[0]
        status = summary.status if summary is not None else None
        return JSONResponse(
            {"last_sequence": last, "status": status, "live": status in LIVE_RUN_STATUSES}
        )

    guard = [Middleware(SessionGuard, key=key)] if actions is not None else []
    return Starlette(
        routes=[
            Route("/", runs),
            Route("/runs/{run_id:path}/details", details),
            Route("/runs/{run_id:path}/events", events),
            Route("/runs/{run_id:path}", run),
            Route("/api/head", head),
            *(actions.routes() if actions is not None else []),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
            *guard,
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

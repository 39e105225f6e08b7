"""The inspector's operator actions: cancel, resume and deliver, off unless asked for.

`runfold ui --allow-actions` turns them on (`resume` also needs `--runtime MODULE:FACTORY`, the
runtime `runfold resume` takes). They go through what the command line's `cancel`, `resume` and
`deliver` call (`runfold.cli.operate`, `CommandHandler.deliver`) on a store the app opens for
writing beside its read-only one; nothing here writes SQL.

Each POST must pass three checks, or it is refused with a 403 and changes nothing:
- its `Origin` (or, without one, its `Referer`) is this server's own origin: a page of another
  site cannot post here, even from the same machine;
- it carries the session's cookie, which is `HttpOnly` and `SameSite=Strict`, so a browser sends
  it only from the inspector's own pages;
- its form's `csrf` field is the session's token, an HMAC of the session id under a key made
  when the server started, which only the inspector's pages hold.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, quote

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runfold.cli import operate
from runfold.engine import WorkflowRuntime
from runfold.handler import CommandHandler
from runfold.kernel import RunfoldError, RunNotFound
from runfold.stores import EventStore

__all__ = ["SESSION_COOKIE", "Actions", "SessionGuard"]

SESSION_COOKIE = "runfold_session"
"""The cookie naming an inspector session (random, `HttpOnly`, `SameSite=Strict`)."""
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_FORM_TYPE = "application/x-www-form-urlencoded"
_MAX_FORM = 2 * 1024 * 1024 + 64 * 1024
"""The largest form body accepted: a payload at the kernel's limit and the other fields."""


class _Forbidden(Exception):
    """A POST that failed a check: refused with a 403 naming which."""


class SessionGuard:
    """ASGI middleware: a session cookie for each browser, and cross-origin POSTs refused.

    A state-changing request whose `Origin` (or `Referer`) is not the server's own is refused
    before any route runs.
    """

    def __init__(self, app: ASGIApp, key: bytes) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.cookies.get(SESSION_COOKIE, "")
        session = given if _well_formed(given) else secrets.token_urlsafe(24)
        scope.setdefault("state", {})["session"] = session
        scope["state"]["csrf"] = token_for(self.key, session)
        if request.method not in _SAFE_METHODS and not _same_origin(request):
            response = Response(
                "refused: this request does not come from the inspector's own pages",
                status_code=403,
                media_type="text/plain",
            )
            await response(scope, receive, send)
            return

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start" and session != given:
                cookie = SimpleCookie()
                cookie[SESSION_COOKIE] = session
                cookie[SESSION_COOKIE]["httponly"] = True
                cookie[SESSION_COOKIE]["samesite"] = "Strict"
                cookie[SESSION_COOKIE]["path"] = "/"
                headers = MutableHeaders(scope=message)
                headers.append("set-cookie", cookie.output(header="").strip())
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def token_for(key: bytes, session: str) -> str:
    """The CSRF token of `session`: what its pages' forms carry and every POST must."""
    return hmac.new(key, session.encode(), hashlib.sha256).hexdigest()


def _well_formed(session: str) -> bool:
    return 16 <= len(session) <= 64 and session.replace("-", "").replace("_", "").isalnum()


def _same_origin(request: Request) -> bool:
    """Whether the request's `Origin`, else its `Referer`, is this server (scheme and host)."""
    host = request.headers.get("host", "")
    own = (f"http://{host}", f"https://{host}")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin in own
    referer = request.headers.get("referer", "")
    return any(referer.startswith(f"{o}/") for o in own)


class Actions:
    """The POST routes, over a store opened for writing; `runtime` enables resume."""

    def __init__(
        self,
        store: Callable[[], EventStore],
        key: bytes,
        runtime: WorkflowRuntime | None,
        error_page: Callable[[Request, int, str], Response],
    ) -> None:
        self._store = store
        self._key = key
        self.runtime = runtime
        self._error_page = error_page

    def routes(self) -> list[Route]:
        """`POST /actions/cancel`, `/actions/resume` and `/actions/deliver`."""
        return [
            Route("/actions/cancel", self._guarded(self._cancel), methods=["POST"]),
            Route("/actions/resume", self._guarded(self._resume), methods=["POST"]),
            Route("/actions/deliver", self._guarded(self._deliver), methods=["POST"]),
        ]

    def _guarded(
        self, action: Callable[[Request, dict[str, str]], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                form = await self._form(request)
            except _Forbidden as exc:
                return self._error_page(request, 403, str(exc))
            try:
                return await action(request, form)
            except RunNotFound as exc:
                return self._error_page(request, 404, str(exc))
            except (RunfoldError, ValueError) as exc:
                return self._error_page(request, 409, str(exc))

        return endpoint

    async def _form(self, request: Request) -> dict[str, str]:
        length = request.headers.get("content-length", "")
        if not length.isdigit() or int(length) > _MAX_FORM:
            raise _Forbidden("refused: a form of unknown or too large a size")
        # The forms are URL-encoded (no files): the standard library reads them, where
        # Starlette's parser would need python-multipart, one more dependency for the extra.
        if request.headers.get("content-type", "").split(";")[0] != _FORM_TYPE:
            raise _Forbidden(f"refused: a form is sent as {_FORM_TYPE}")
        try:
            pairs = parse_qsl((await request.body()).decode(), strict_parsing=False)
        except UnicodeDecodeError:
            raise _Forbidden("refused: a form that is not UTF-8") from None
        fields = dict(pairs)
        session = request.cookies.get(SESSION_COOKIE)
        if session is None or not _well_formed(session):
            raise _Forbidden("refused: no inspector session (cookies must be on)")
        if not hmac.compare_digest(fields.get("csrf", ""), token_for(self._key, session)):
            raise _Forbidden("refused: the form's token is not this session's")
        return fields

    def _back(self, run_id: str) -> Response:
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}", status_code=303)

    async def _cancel(self, request: Request, form: dict[str, str]) -> Response:
        run_id = form.get("run_id", "")
        await operate.cancel(self._store(), run_id, form.get("reason") or None)
        return self._back(run_id)

    async def _resume(self, request: Request, form: dict[str, str]) -> Response:
        if self.runtime is None:
            return self._error_page(
                request, 409, "resume needs a runtime: runfold ui --runtime MODULE:FACTORY"
            )
        run_id = form.get("run_id", "")
        [resumed] = await operate.resume(self._store(), self.runtime, run_id)
        return self._back(resumed.run_id)

    async def _deliver(self, request: Request, form: dict[str, str]) -> Response:
        outcome = await CommandHandler(self._store()).deliver(
            form.get("token", ""),
            form.get("payload", "").encode(),
            delivery_id=form.get("delivery_id") or None,
        )
        return self._back(outcome.snapshot.run_id)

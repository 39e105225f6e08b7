"""runfold's local web inspector: runs, a run's timeline, tables and history, in a browser.

Read-only unless asked: it opens the store, lists and reads, and never writes; with
`allow_actions` its run pages also offer cancel, deliver and (given a runtime) resume, behind
CSRF checks (`runfold.ui.actions`). `serve(store_url)` runs it;
`python -m runfold.ui --store URL` does the same from a shell. It needs the optional `ui` extra
(`pip install 'runfold[ui]'`: Starlette, uvicorn, Jinja2).
"""

from __future__ import annotations

import sys

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn
except ImportError as exc:  # the extra is not installed
    _NEEDS_EXTRA = (
        f"runfold.ui needs the `ui` extra: pip install 'runfold[ui]' ({exc.name} is missing)"
    )
    # `python -m runfold.ui` imports this package before its `__main__` can catch anything;
    # there, the missing extra is one line and exit 2, as the command line promises, not a
    # traceback. (Python sets `sys.argv[0]` to "-m" while it locates the module to run.)
    if sys.argv[:1] == ["-m"] and sys.orig_argv[-len(sys.argv)] == "runfold.ui":
        print(f"runfold.ui: error: {_NEEDS_EXTRA}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(_NEEDS_EXTRA) from exc

import asyncio
import re
import signal
import socket
from types import FrameType

from runfold.ui.app import LOOPBACK_HOSTS, create_app
from runfold.ui.app import open_read_store as _open_read_store

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "create_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
"""The inspector binds loopback unless told otherwise: run data is for this machine's users."""
DEFAULT_PORT = 8765
"""The inspector's default TCP port."""

_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@/\s]*@")


def redact_url(text: str) -> str:
    """`text` with any password in a URL (`scheme://user:password@host`) replaced by `***`."""
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


def serve(
    store_url: str,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    allow_actions: bool = False,
    runtime: str | None = None,
) -> None:
    """Serve the inspector over the store at `store_url` on `http://host:port/` until stopped.

    With `allow_actions`, run pages offer the operator actions (cancel, deliver, and resume
    with `runtime`, a `MODULE:FACTORY`); see `runfold.ui.actions`.

    The store is opened once first and the address bound before the URL is printed, so a bad
    URL, a missing file or a port that is taken fails here, before the server starts. Ctrl-C
    stops the server and then raises `KeyboardInterrupt`, as it would anywhere else.

    Raises:
        ValueError: `store_url` is not a store URL runfold knows, or `port` is not 0 to 65535,
            or `runtime` is given without `allow_actions`.
        RuntimeLoadError: `runtime` does not name a callable that makes a runtime (a
            `ValueError`).
        StoreOpenError: The store cannot be opened (a SQLite file that does not exist, …).
        StoreUnavailable: The store cannot be reached.
        OSError: The inspector cannot listen on `host` and `port` (taken, not an address of
            this machine); the message names them.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"a port is a number from 0 to 65535, not {port}")
    if runtime is not None and not allow_actions:
        raise ValueError("a runtime is for the resume action: give allow_actions too")
    asyncio.run(_check(store_url))
    if runtime is not None:
        from runfold.cli.runtimes import resolve_factory

        resolve_factory(runtime)  # a name that does not resolve fails here, not at start-up
    listening = _listen(host, port)
    loopback = host in LOOPBACK_HOSTS
    app = create_app(
        store_url,
        allowed_hosts=LOOPBACK_HOSTS if loopback else ["*"],
        allow_actions=allow_actions,
        runtime=runtime,
    )
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False))
    shown = f"[{host}]" if ":" in host else host
    port = listening.getsockname()[1]  # the one the system chose, for port 0
    server.url = f"http://{shown}:{port}/"
    server.mode = "operator actions on" if allow_actions else "read-only"
    server.run(sockets=[listening])
    if server.interrupted:
        raise KeyboardInterrupt


class _Server(uvicorn.Server):
    """uvicorn's server, remembering whether Ctrl-C stopped it.

    It shuts down gracefully on SIGINT and then returns as if all went well (`uvicorn.run`
    even swallows the `KeyboardInterrupt`); `serve` raises it again so that the command line
    exits 130, like every other command stopped with Ctrl-C.
    """

    interrupted = False
    url = ""
    mode = "read-only"

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start serving, then say where: from then on, Ctrl-C is the server's to handle."""
        await super().startup(sockets)
        if not self.should_exit:  # uvicorn has logged why it could not start
            print(f"runfold inspector ({self.mode}) on {self.url}", flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.interrupted = self.interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host` and `port`, or an `OSError` that names them."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listening = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
    except OSError as exc:
        listening.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return listening


async def _check(store_url: str) -> None:
    store = await _open_read_store(store_url)
    await store.close()

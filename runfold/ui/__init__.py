"""runfold's local web inspector: runs, a run's timeline, tables and history, in a browser.

Read-only: it opens the store, lists and reads, and never writes. `serve(store_url)` runs it;
`python -m runfold.ui --store URL` does the same from a shell. It needs the optional `ui` extra
(`pip install 'runfold[ui]'`: Starlette, uvicorn, Jinja2).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        f"runfold.ui needs the `ui` extra: pip install 'runfold[ui]' ({exc.name} is missing)"
    ) from exc

import asyncio
import re

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


def serve(store_url: str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve the inspector over the store at `store_url` on `http://host:port/` until stopped.

    The store is opened once first, so a bad URL or a missing file fails here, before the
    server starts.

    Raises:
        ValueError: `store_url` is not a store URL runfold knows.
        StoreOpenError: The store cannot be opened (a SQLite file that does not exist, …).
        StoreUnavailable: The store cannot be reached.
    """
    asyncio.run(_check(store_url))
    loopback = host in LOOPBACK_HOSTS
    app = create_app(store_url, allowed_hosts=LOOPBACK_HOSTS if loopback else ["*"])
    shown = f"[{host}]" if ":" in host else host
    print(f"runfold inspector (read-only) on http://{shown}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


async def _check(store_url: str) -> None:
    store = await _open_read_store(store_url)
    await store.close()

"""`open_store(url)`: the store a URL names, and clear refusals for the rest."""

from __future__ import annotations

import pytest

from runfold import CommandHandler, EventStore, open_store
from runfold.commands import StartRun
from runfold.errors import StoreClosed
from runfold.events import RunStarted
from runfold.kernel import CreateRun
from runfold.stores import FeedSubscriber, IndexRewriter, SchemaMigrator
from tests.conftest import Clock


async def test_memory_url_opens_a_working_store() -> None:
    async with await open_store("memory://") as store:
        assert isinstance(store, EventStore)
        handler = CommandHandler(store, clock=Clock())
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        assert [type(e.event) for e in await store.read("r")][-1] is RunStarted
        assert await store.head("r") == 2
        assert [s.run_id for s in (await store.list_runs()).items] == ["r"]
    with pytest.raises(StoreClosed):
        await store.head("r")


async def test_a_memory_store_keeps_no_schema_and_pushes_no_feed() -> None:
    async with await open_store("memory://") as store:
        assert isinstance(store, IndexRewriter)
        assert not isinstance(store, SchemaMigrator | FeedSubscriber)


async def test_each_memory_url_is_a_separate_store() -> None:
    first, second = await open_store("memory://"), await open_store("memory://")
    try:
        await CommandHandler(first, clock=Clock()).execute(
            "r", StartRun(create=CreateRun(workflow_name="wf", input=b""))
        )
        assert (await first.head("r"), await second.head("r")) == (2, 0)
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("", id="empty"),
        pytest.param("memory", id="no-separator"),
        pytest.param("memory:", id="scheme-only"),
        pytest.param("memory:/", id="one-slash"),
        pytest.param("/var/lib/runs.db", id="bare-path"),
        pytest.param("://", id="no-scheme"),
        pytest.param("redis://localhost:6379/0", id="unknown-scheme"),
        pytest.param("mysql://user@host/db", id="unknown-database"),
        pytest.param("memroy://", id="misspelt"),
        pytest.param(" memory://", id="leading-space"),
    ],
)
async def test_unknown_or_malformed_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        await open_store(url)
    message = str(caught.value)
    assert repr(url) in message  # names what was wrong ...
    scheme = url.partition("://")[0] if "://" in url else None
    if scheme:
        assert repr(scheme) in message  # ... down to the scheme it did not recognise

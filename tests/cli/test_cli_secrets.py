"""A PostgreSQL password never shows, however it is given: the real `runfold` in a subprocess
against the real server, for every form of the password, with logins refused, servers that do
not answer, strings libpq cannot parse, and connections that work; and `PostgresStore.open` in
process, for its exceptions."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import attrs
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from runfold.kernel import StoreError
from runfold.stores import conninfo
from runfold.stores.postgres import PostgresStore
from tests.support.cli_support import one_line_error, runfold_cli
from tests.support.postgres_support import DSN, admin, schema_name

SERVER = {key: str(value) for key, value in conninfo_to_dict(DSN).items()}
HOST = SERVER.get("host", "127.0.0.1")
PORT = SERVER.get("port", "5432")
USER = SERVER.get("user", "postgres")
DATABASE = SERVER.get("dbname", "postgres")


@attrs.frozen
class Form:
    """One way of giving a password: the store argument, the environment, and the secret."""

    name: str
    store: str
    env: dict[str, str]
    secret: str


FORM_NAMES = ["userinfo", "query", "keywords", "PGPASSWORD"]


def form(name: str, user: str, port: str, schema: str) -> Form:
    """The password given the `name` way, a secret of its own (trust logins take any)."""
    secret = f"pw-{name}-{uuid.uuid4().hex[:8]}"
    where = f"{HOST}:{port}/{DATABASE}"
    if name == "userinfo":
        return Form(name, f"postgresql://{user}:{secret}@{where}?schema={schema}", {}, secret)
    if name == "query":
        store = f"postgresql://{user}@{where}?password={secret}&schema={schema}"
        return Form(name, store, {}, secret)
    if name == "keywords":  # a keyword string has no schema: it names the default one
        keywords = make_conninfo(host=HOST, port=port, user=user, dbname=DATABASE, password=secret)
        return Form(name, keywords, {}, secret)
    assert name == "PGPASSWORD"
    return Form(name, f"postgresql://{user}@{where}?schema={schema}", {name: secret}, secret)


@pytest.fixture
def schema() -> Iterator[str]:
    admin()  # skips without a server (fails under CI=true)
    name = schema_name("cli")
    yield name
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def shown(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


@pytest.mark.parametrize("name", FORM_NAMES)
def test_a_refused_login_is_one_line_without_the_password(schema: str, name: str) -> None:
    given = form(name, f"nobody_{uuid.uuid4().hex[:6]}", PORT, schema)
    for command in ("runs", "migrate", "demo"):
        done = runfold_cli("--store", given.store, command, env=given.env)
        line = one_line_error(done, 4)  # one line: no warning of the pool before it
        assert "does not exist" in line and "cannot open postgresql://" in line
        assert given.secret not in shown(done), (command, shown(done))


@pytest.mark.parametrize("name", FORM_NAMES)
def test_a_server_that_does_not_answer_is_one_line_without_the_password(
    schema: str, name: str
) -> None:
    given = form(name, USER, "9", schema)
    done = runfold_cli("runs", "--store", given.store, env=given.env)
    line = one_line_error(done, 4)
    assert "cannot open postgresql://" in line and ":9" in line
    assert given.secret not in shown(done)


@pytest.mark.parametrize("name", ["userinfo", "query", "PGPASSWORD"])
def test_a_working_store_is_shown_without_its_password(schema: str, name: str) -> None:
    given = form(name, USER, PORT, schema)
    missing = runfold_cli("runs", "--store", given.store, env=given.env)
    assert f"schema {schema!r} holds no runfold store" in one_line_error(missing, 4)
    assert (
        admin()
        .execute(  # reading made nothing
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
        )
        .fetchall()
        == []
    )
    migrated = runfold_cli("migrate", "--store", given.store, env=given.env)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("migrated postgresql://") and "0 -> " in migrated.stdout
    if name != "PGPASSWORD":
        assert f"{USER}:***@" in migrated.stdout  # the label says a password was given
    demo = runfold_cli("demo", "--store", given.store, env=given.env)
    assert demo.returncode == 0, demo.stderr
    for done in (missing, migrated, demo):
        assert given.secret not in shown(done)


@pytest.mark.parametrize(
    ("store", "secret"),
    [
        (f"postgresql://{USER}:p%zzsecret-1@{HOST}/{DATABASE}", "secret-1"),
        (f"host={HOST} password=secret-2 tail-2", "tail-2"),
        (f"postgresql://{USER}@{HOST}/{DATABASE}?password=secret-3&bogus=1", "secret-3"),
    ],
    ids=["bad-percent", "bad-keyword", "bad-parameter"],
)
def test_a_string_libpq_cannot_parse_is_a_usage_error_that_quotes_none_of_it(
    store: str, secret: str
) -> None:
    done = runfold_cli("--store", store, "runs")
    line = one_line_error(done, 2)
    assert "not a valid PostgreSQL connection string" in line
    assert secret not in shown(done) and "secret" not in shown(done)


async def test_a_keyword_string_opens_a_store(schema: str) -> None:
    keywords = make_conninfo(host=HOST, port=PORT, user=USER, dbname=DATABASE, password="pw-k1")
    async with await PostgresStore.open(keywords, schema=schema) as store:
        assert store.migrated_from == 0
    async with await PostgresStore.open(keywords, schema=schema, migrate=False) as store:
        assert store.migrated_from is None


async def test_open_raises_nothing_that_names_the_password(schema: str) -> None:
    secret = f"pw-api-{uuid.uuid4().hex[:6]}"
    attempts = [
        f"postgresql://nobody_api:{secret}@{HOST}:{PORT}/{DATABASE}",
        f"postgresql://nobody_api@{HOST}:{PORT}/{DATABASE}?password={secret}",
        f"host={HOST} port={PORT} user=nobody_api password={secret}",
        f"postgresql://{USER}:{quote(secret)}@{HOST}:9/{DATABASE}",
        f"postgresql://{USER}:{secret}%zz@{HOST}/{DATABASE}",
    ]
    for dsn in attempts:
        with pytest.raises((StoreError, ValueError)) as caught:
            await PostgresStore.open(dsn, schema=schema, timeout=2)
        error: BaseException | None = caught.value
        while error is not None:  # the message, its repr, and whatever it was raised from
            assert secret not in f"{error} {error!r}", dsn
            error = error.__cause__ or error.__context__


def test_describe_and_scrub(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        conninfo.describe("postgresql://u:pw@h:5432/db?schema=s&sslmode=disable")
        == "postgresql://u:***@h:5432/db?sslmode=disable&schema=s"
    )
    assert conninfo.describe("host=h user=u password=pw dbname=d") == "postgresql://u:***@h/d"
    assert "pw" not in conninfo.describe("postgresql://u@h/d?password=pw")
    assert conninfo.describe("host=h password=p w") == (
        "postgresql://(a connection string libpq cannot parse)"
    )
    monkeypatch.setenv("PGPASSWORD", "from-env")
    dsn = "postgresql://u:a%40b@h/d"
    assert conninfo.scrub("a@b a%40b from-env", dsn) == "*** *** ***"


@pytest.mark.parametrize(
    ("dsn", "shown_as"),
    [
        (
            "host=a,b port=5432,5433 dbname=d target_session_attrs=read-write",
            "postgresql://a:5432,b:5433/d?target_session_attrs=read-write",
        ),
        ("postgresql://u@a:5432,b:5433/d", "postgresql://u@a:5432,b:5433/d"),
        ("host=a,b port=6432 dbname=d", "postgresql://a:6432,b:6432/d"),
        ("host=a,b,c port=1,2", "postgresql://a,b,c?port=1%2C2"),  # libpq refuses it later
        ("host=::1 port=5 dbname=d", "postgresql://[::1]:5/d"),
    ],
)
def test_several_hosts_are_shown_each_with_its_port(dsn: str, shown_as: str) -> None:
    described = conninfo.describe(dsn)
    assert described == shown_as
    # What is shown names the same servers: libpq reads it back to the same hosts and ports.
    if "%2C" not in described:
        again = conninfo_to_dict(described)
        given = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
        assert (again.get("host"), again.get("port", "")) == (
            given.get("host"),
            ",".join([given["port"]] * len(given["host"].split(",")))
            if "," not in given.get("port", ",")
            else given["port"],
        )


def test_a_store_url_given_out_of_place_is_not_echoed() -> None:
    done = runfold_cli("runs", f"postgresql://{USER}:pw-stray-1@{HOST}/{DATABASE}")
    line = one_line_error(done, 2)
    assert "unexpected extra argument" in line and f"{USER}:***@" in line
    assert "pw-stray-1" not in shown(done)


def test_a_mistyped_scheme_is_named_without_its_password() -> None:
    done = runfold_cli("--store", "postgresq://app:pw-typo-1@db/app", "runs")
    line = one_line_error(done, 2)
    assert "unsupported store scheme 'postgresq' in 'postgresq://app:***@db/app'" in line
    assert "pw-typo-1" not in shown(done)

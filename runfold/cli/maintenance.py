"""The commands that look after a store itself: `migrate` its schema, `verify` its index rows.

`migrate` creates or upgrades the schema and says from which version. `verify` replays every run
and compares its index rows with what the kernel derives from its history, and with
`--rebuild-index` rewrites the rows that differ; the work is `runfold.cli.verify`'s.
"""

from __future__ import annotations

import click

from runfold.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from runfold.cli.options import json_option, store_option
from runfold.cli.output import Terminal, to_json
from runfold.cli.store_access import label, store_url, work_on_store
from runfold.cli.verify import can_rebuild, verify_store
from runfold.handler import utc_now
from runfold.stores import EventStore
from runfold.stores.protocol import SchemaMigrator


@click.command()
@click.option("--rebuild-index", is_flag=True, help="rewrite the index rows that differ")
@json_option
@store_option
@click.pass_context
def verify(
    ctx: click.Context, rebuild_index: bool, as_json: bool, command_store: str | None
) -> int:
    """Replay every run and check its index rows against its history.

    Read-only unless --rebuild-index.
    """

    async def work(store: EventStore, terminal: Terminal) -> int:
        if rebuild_index and not can_rebuild(store):
            raise CliError(
                f"{type(store).__name__} cannot rewrite its index (it has no rewrite_index)",
                EXIT_USAGE,
            )
        report = await verify_store(
            store,
            now=utc_now(),
            rebuild=rebuild_index,
            progress=lambda done, total: terminal.progress(done, total, "verifying"),
        )
        if as_json:
            terminal.json(
                {
                    "runs": report.runs,
                    "ok": report.ok,
                    "problems": [to_json(p) for p in report.problems],
                }
            )
            return EXIT_OK if report.ok else EXIT_FAILED
        for problem in report.problems:
            mark = ("repaired", "green") if problem.repaired else ("problem", "red")
            terminal.line(mark, f"  {problem.run_id}  {problem.kind}: {problem.detail}")
        repaired = sum(p.repaired for p in report.problems)
        left = len(report.problems) - repaired
        verdict = ("ok", "green") if report.ok else ("FAILED", "red")
        terminal.line(
            verdict,
            f": {report.runs} run(s) checked, {left} problem(s)"
            + (f", {repaired} repaired" if repaired else ""),
        )
        return EXIT_OK if report.ok else EXIT_FAILED

    return work_on_store(ctx, command_store, work, read_only=not rebuild_index)


@click.command()
@store_option
@click.pass_context
def migrate(ctx: click.Context, command_store: str | None) -> int:
    """Create or upgrade the store's schema, and say what was done."""
    url = store_url(ctx, command_store)

    async def work(store: EventStore, terminal: Terminal) -> int:
        if not isinstance(store, SchemaMigrator):
            terminal.line(f"{type(store).__name__} keeps no schema: nothing to migrate")
            return EXIT_OK
        # Stores with a schema migrate when opened for writing, and say from where.
        current = store.schema_version
        before = store.migrated_from
        if before is None:
            terminal.line(f"{label(url)} is already at version {current}")
        else:
            terminal.line(f"migrated {label(url)}: {before} -> {current}")
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)

"""`runfold`: the command line (also `python -m runfold`), on click and rich.

`runfold [--store URL] COMMAND [OPTIONS]` (`--store` may also follow the command), where the
store is `--store`, else `$RUNFOLD_STORE`, else `sqlite:///runfold.db`:

- `demo`: an order-fulfilment workflow through `Engine`, told as it runs, then its timeline,
  its final snapshot and the store's runs of it; an interrupted demo run is finished first.
- `runs [--status S] [--workflow W] [--limit N] [--cursor C] [--json]`: runs, newest first.
- `show RUN_ID [--json]`: a run's snapshot. `history RUN_ID [--json]`: its events.
- `verify [--rebuild-index] [--json]`: replay every run, compare its index rows with the log.
- `migrate`: create or upgrade the schema, saying from which version.
- `cancel RUN_ID [--reason R]`, `resume --runtime MODULE:FACTORY (RUN_ID | --due)`,
  `delete (RUN_ID | --ended-before TIME)`, `deliver TOKEN PAYLOAD`, `send RUN_ID MESSAGE`:
  operate runs. `ui [--allow-actions]`: the web inspector.
- `conformance MODULE:FACTORY`: the store kit.

`runs`, `show`, `history` and `verify` (without `--rebuild-index`) only read: they never
create, migrate or lock a store. Tables and colour on a terminal (unless `NO_COLOR` is set),
plain text when piped, JSON with `--json`. Errors are one line on stderr; the exit codes are the
`EXIT_*` constants of `runfold.cli.app` (0 ok, 1 a check failed, 2 usage, 3 unknown run, 4 store
unusable, 5 corrupt history, 130 interrupted). No output names a store's password.
"""

from runfold.cli.app import main

__all__ = ["main"]

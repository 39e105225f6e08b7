"""`runfold conformance`: the store conformance kit, run from the command line on a store factory.

The kit is an extra (`runfold[conformance]`): without it the command says so and exits 2. Its
arguments go to the kit unparsed, so its options and its `--help` are the kit's own, those of
`python -m runfold.conformance`.
"""

from __future__ import annotations

import click

from runfold.cli.exit_codes import EXIT_OK, EXIT_USAGE, CliError


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("target", metavar="MODULE:FACTORY")
@click.argument("options", nargs=-1, type=click.UNPROCESSED, metavar="[OPTION]...")
def conformance(target: str, options: tuple[str, ...]) -> int:
    """Run the store conformance kit against a store factory.

    The options go to the kit: --examples N, --seed S, --check NAME, --without CAPABILITY,
    --no-shrink (python -m runfold.conformance --help).
    """
    try:
        import runfold.conformance as kit
    except ImportError as exc:
        raise CliError(
            "the conformance kit needs its extra: pip install 'runfold[conformance]' "
            f"({exc.name or exc} is missing)",
            EXIT_USAGE,
        ) from None
    run_kit = getattr(kit, "main", None)
    if run_kit is None:
        raise CliError(
            "the conformance kit is not available in this runfold (runfold.conformance.main "
            "is missing)",
            EXIT_USAGE,
        )
    try:
        code: int = run_kit([target, *options], prog="runfold conformance")
    except SystemExit as done:  # the kit's own --help
        return done.code if isinstance(done.code, int) else EXIT_OK
    return code

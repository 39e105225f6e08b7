"""`python -m runfold.ui --store URL [--host H] [--port P]`: serve the inspector from a shell."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runfold.kernel import StoreError
from runfold.ui import DEFAULT_HOST, DEFAULT_PORT, redact_url, serve


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and serve; 2 for a store or an address that cannot be used (and,
    from the package's import, without the `ui` extra); 130 when stopped with Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m runfold.ui", description="runfold's read-only web inspector"
    )
    parser.add_argument("--store", required=True, help="store URL, e.g. sqlite:///runfold.db")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    args = parser.parse_args(argv)
    try:
        serve(args.store, host=args.host, port=args.port)
    except (ValueError, ImportError, StoreError, OSError) as exc:
        print(f"runfold.ui: error: {redact_url(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

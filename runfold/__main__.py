"""`python -m runfold`: the `runfold` command line."""

from runfold.cli import main

raise SystemExit(main())

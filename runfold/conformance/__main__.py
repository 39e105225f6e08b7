"""`python -m runfold.conformance MODULE:FACTORY [--examples N] [--seed S] [--check NAME]`."""

from runfold.conformance.runner import main

raise SystemExit(main())

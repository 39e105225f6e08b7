"""An application whose import takes a while, for stopping `runfold worker` while it starts.

On import it writes the file named by `RUNFOLD_SLOW_START_MARK` (so a test knows the worker is
importing it), then sleeps `RUNFOLD_SLOW_START_SECONDS` before defining its one workflow.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from runfold.flow import workflow

Path(os.environ["RUNFOLD_SLOW_START_MARK"]).write_text("importing")
time.sleep(float(os.environ.get("RUNFOLD_SLOW_START_SECONDS", "3")))


@workflow(name="slow-start-echo")
async def echo(value: str) -> str:
    return value

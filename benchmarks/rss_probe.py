"""`python -m benchmarks.rss_probe ROWS.pickle`: in a fresh interpreter, load encoded rows,
then decode + fold them and hold the snapshot; print as JSON how far the peak resident set
rose above the resident set before the fold (bytes), and how that was read.

On Linux the peak is reset first (`/proc/self/clear_refs`), so loading the rows leaves no
high-water mark that would hide the fold's. Elsewhere `ru_maxrss` before and after is compared,
which gives a lower bound."""

from __future__ import annotations

import gc
import json
import pickle
import re
import resource
import sys
from pathlib import Path

from benchmarks.kernel import decode_and_fold

_STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def _max_rss_bytes() -> int:
    # ru_maxrss is in kilobytes on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def main(path: str) -> None:
    with Path(path).open("rb") as file:
        rows = pickle.load(file)
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    except OSError:
        before = _max_rss_bytes()
        snapshot = decode_and_fold(rows)
        growth, method = _max_rss_bytes() - before, "ru_maxrss before and after (a lower bound)"
    else:
        before = _status_kib("VmRSS")
        snapshot = decode_and_fold(rows)
        growth, method = 1024 * (_status_kib("VmHWM") - before), "VmHWM reset, then read"
    assert snapshot.last_sequence == len(rows)
    print(json.dumps({"growth": growth, "method": method}))


if __name__ == "__main__":
    main(sys.argv[1])

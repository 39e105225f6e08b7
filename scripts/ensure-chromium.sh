#!/usr/bin/env bash
# Make sure a headless Chromium is here for the web inspector's browser tests (playwright drives
# it through executable_path; playwright's own browser download is not used).
# RUNFOLD_TEST_CHROMIUM wins when set; otherwise Debian's /usr/bin/chromium, installed if
# missing and we are root. Quick when the browser is already there.
set -euo pipefail

browser="${RUNFOLD_TEST_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$browser" ]; then
  exit 0
fi
if [ -n "${RUNFOLD_TEST_CHROMIUM:-}" ]; then
  echo "ensure-chromium: RUNFOLD_TEST_CHROMIUM=$browser is not an executable" >&2
  exit 1
fi
if [ "$(id -u)" != "0" ]; then
  echo "ensure-chromium: no $browser here and not root; install chromium or set RUNFOLD_TEST_CHROMIUM" >&2
  exit 1
fi
echo "ensure-chromium: installing chromium" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
if [ ! -x "$browser" ]; then
  echo "ensure-chromium: chromium installed but $browser is missing" >&2
  exit 1
fi

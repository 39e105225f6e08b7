#!/usr/bin/env bash
# Make sure a PostgreSQL server answers for the test suite.
# RUNFOLD_TEST_POSTGRES_DSN wins when set; otherwise the local server on 127.0.0.1:5432 is used,
# started if installed but down, installed (Debian packages) if missing and we are root.
set -euo pipefail

if [ -n "${RUNFOLD_TEST_POSTGRES_DSN:-}" ]; then
  exit 0
fi

ready() { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432; }

if ready; then
  exit 0
fi

if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  if [ "$(id -u)" != "0" ]; then
    echo "ensure-postgres: no PostgreSQL server here and not root; set RUNFOLD_TEST_POSTGRES_DSN" >&2
    exit 1
  fi
  echo "ensure-postgres: installing PostgreSQL" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  # Trust auth on loopback, as the test DSN expects no password.
  sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/; s/^(local\s+all\s+postgres\s+)\S+/\1trust/' \
    "/etc/postgresql/$version/main/pg_hba.conf"
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
for _ in $(seq 1 30); do
  if ready; then
    exit 0
  fi
  sleep 1
done
echo "ensure-postgres: PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1

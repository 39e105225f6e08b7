#!/usr/bin/env bash
# A Citus 12.1 cluster on loopback: a coordinator and two workers, each a PostgreSQL 15 server of
# its own (Debian's server binaries in /usr/lib/postgresql/15/bin), for `make test-citus` and the
# Citus benchmark row.
#
#   scripts/citus-cluster.sh start DIR   # installs Citus if missing, starts the three nodes
#   scripts/citus-cluster.sh stop DIR    # stops the nodes started in DIR
#
# Citus comes from ../shared/citus/install.sh beside the repository (it installs the prebuilt
# 12.1.12 into the machine's PostgreSQL 15, or builds it from source); without that folder and
# without Citus installed, `start` exits 3 with the reason. Nodes: the coordinator on
# 127.0.0.1:55441, workers on 55442 and 55443 (not 5432, which the other tests use); data
# directories and logs in DIR. Every node runs as the `postgres` user (PostgreSQL refuses root).
set -euo pipefail

action=${1:?start or stop}
dir=${2:?directory}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=/usr/lib/postgresql/15/bin
ports=(55441 55442 55443)
as_postgres() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [[ $action == stop ]]; then
    for port in "${ports[@]}"; do
        if [[ -f $dir/node$port/postmaster.pid ]]; then
            as_postgres "$bin/pg_ctl" -D "$dir/node$port" -m immediate -w stop >/dev/null || true
        fi
    done
    exit 0
fi
[[ $action == start ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

if [[ ! -f $bin/postgres ]]; then
    echo "citus-cluster: no PostgreSQL 15 server binaries in $bin" >&2
    exit 3
fi
if [[ ! -f /usr/lib/postgresql/15/lib/citus.so ]]; then
    installer=$root/../shared/citus/install.sh
    if [[ ! -f $installer ]]; then
        echo "citus-cluster: Citus is not installed and ../shared/citus/install.sh is absent" >&2
        exit 3
    fi
    bash "$installer"
fi

mkdir -p "$dir"
chown postgres "$dir" 2>/dev/null || true
for port in "${ports[@]}"; do
    data=$dir/node$port
    if [[ ! -d $data ]]; then
        as_postgres "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/dev/null
        cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_preload_libraries = 'citus'
max_connections = 200
max_prepared_transactions = 200
shared_buffers = 128MB
fsync = on
citus.shard_count = 8
EOF
    fi
    # The ports lie in Linux's ephemeral range: a client's connection elsewhere may hold one
    # for a moment (the node then cannot bind it). Keep the kernel from handing them out, where
    # allowed, and try again a few times.
    if [[ -w /proc/sys/net/ipv4/ip_local_reserved_ports ]]; then
        reserved=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports)
        echo "${reserved:+$reserved,}${ports[0]}-${ports[-1]}" \
            >/proc/sys/net/ipv4/ip_local_reserved_ports || true
    fi
    for attempt in 1 2 3 4 5; do
        if as_postgres "$bin/pg_ctl" -D "$data" -l "$dir/node$port.log" -w start >/dev/null; then
            break
        fi
        [[ $attempt = 5 ]] && exit 1
        sleep 2
    done
done

psql_at() { "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2" >/dev/null; }
for port in "${ports[@]}"; do
    psql_at "$port" "CREATE EXTENSION IF NOT EXISTS citus"
done
coordinator=${ports[0]}
psql_at "$coordinator" "SELECT citus_set_coordinator_host('127.0.0.1', $coordinator)"
for port in "${ports[@]:1}"; do
    psql_at "$coordinator" "SELECT citus_add_node('127.0.0.1', $port)"
done
echo "citus-cluster: coordinator 127.0.0.1:$coordinator, workers ${ports[*]:1} (data in $dir)"

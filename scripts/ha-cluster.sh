#!/usr/bin/env bash
# A highly available PostgreSQL 15 on loopback: one etcd, two Patroni nodes, synchronous
# replication. Built from Debian packages (apt-get install patroni etcd-server; PostgreSQL 15's
# server binaries in /usr/lib/postgresql/15/bin).
#
#   scripts/ha-cluster.sh ensure       # install what is missing (root: apt-get), check the ports
#   scripts/ha-cluster.sh start DIR    # etcd and both nodes; waits for a primary and a standby
#   scripts/ha-cluster.sh node N DIR   # (re)start node N's Patroni (after it was killed)
#   scripts/ha-cluster.sh stop DIR     # stop everything started in DIR
#
# Nodes: node1 serves 127.0.0.1:55431 (REST API 58001), node2 127.0.0.1:55432 (58002); etcd
# listens on 127.0.0.1:23790. The connection string of the cluster is
#   host=127.0.0.1,127.0.0.1 port=55431,55432 user=postgres dbname=postgres
#   target_session_attrs=read-write
# Everything runs as the `postgres` user (PostgreSQL refuses root); logs are in DIR/*.log.
set -euo pipefail

action=${1:?ensure, start, node or stop}
if [[ $action == ensure ]]; then
    dir=
elif [[ $action == node ]]; then
    node=${2:?node number}
    dir=${3:?directory}
else
    dir=${2:?directory}
fi
bin=/usr/lib/postgresql/15/bin
as_postgres() { runuser -u postgres -- "$@"; }

config() { # node number -> its Patroni configuration
    local n=$1
    cat <<EOF
scope: runfold-ha
name: node$n
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:5800$n
  connect_address: 127.0.0.1:5800$n
etcd:
  host: 127.0.0.1:23790
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    primary_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: "on"
        max_connections: 100
  initdb:
    - encoding: UTF8
    - data-checksums
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:5543$n
  connect_address: 127.0.0.1:5543$n
  data_dir: $dir/node$n
  bin_dir: $bin
  pgpass: $dir/pgpass$n
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: $dir
EOF
}

start_node() {
    local n=$1
    config "$n" > "$dir/node$n.yml"
    chown postgres "$dir/node$n.yml"
    as_postgres bash -c "nohup patroni '$dir/node$n.yml' >> '$dir/node$n.log' 2>&1 & echo \$! > '$dir/node$n.pid'"
}

role() { # node number -> primary, replica, or nothing
    curl -s -m 1 "http://127.0.0.1:5800$1/patroni" | python3 -c \
        'import json,sys; print(json.load(sys.stdin).get("role",""))' 2>/dev/null || true
}

case $action in
ensure)
    # Debian's packages: patroni (3.0.2 on bookworm), etcd-server (3.4) and PostgreSQL 15's
    # server; installed when missing, which needs root (so do the nodes: they run as postgres).
    if [[ $(id -u) != 0 ]]; then
        echo "ha-cluster: needs root (apt-get, and runuser to start the nodes as postgres)" >&2
        exit 1
    fi
    missing=()
    command -v patroni >/dev/null || missing+=(patroni)
    command -v etcd >/dev/null || missing+=(etcd-server)
    [[ -x $bin/postgres ]] || missing+=(postgresql-15)
    command -v curl >/dev/null || missing+=(curl)
    if ((${#missing[@]})); then
        echo "ha-cluster: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    # The Debian package may start an etcd of its own on 2379; ours uses 23790, and the nodes
    # 55431-55432 and 58001-58002: all must be free (a cluster left running by an earlier run
    # is stopped with `stop DIR`).
    for port in 23790 23800 55431 55432 58001 58002; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "ha-cluster: port $port is in use" >&2
            exit 1
        fi
    done
    ;;
start)
    mkdir -p "$dir"
    chown postgres "$dir"
    as_postgres bash -c "nohup etcd --name runfold-ha --data-dir '$dir/etcd' \
        --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
        --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
        --initial-cluster runfold-ha=http://127.0.0.1:23800 --enable-v2=true \
        >> '$dir/etcd.log' 2>&1 & echo \$! > '$dir/etcd.pid'"
    for _ in $(seq 100); do curl -s -m 1 http://127.0.0.1:23790/health | grep -q true && break; sleep 0.1; done
    start_node 1
    for _ in $(seq 300); do [[ $(role 1) =~ ^(primary|master)$ ]] && break; sleep 0.2; done
    start_node 2
    for _ in $(seq 600); do
        [[ $(role 2) == replica ]] && as_postgres "$bin/psql" -h 127.0.0.1 -p 55431 -Atc \
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'" | grep -q 1 && break
        sleep 0.2
    done
    echo "node1: $(role 1), node2: $(role 2)"
    ;;
node)
    start_node "$node"
    ;;
stop)
    # The nodes first (Patroni stops its PostgreSQL, and needs etcd meanwhile), then etcd.
    for n in 1 2; do
        [[ -f $dir/node$n.pid ]] && kill "$(cat "$dir/node$n.pid")" 2>/dev/null || true
    done
    for n in 1 2; do
        for _ in $(seq 300); do
            [[ -f $dir/node$n.pid ]] && kill -0 "$(cat "$dir/node$n.pid")" 2>/dev/null || break
            sleep 0.1
        done
        [[ -f $dir/node$n/postmaster.pid ]] && as_postgres "$bin/pg_ctl" -D "$dir/node$n" stop -m immediate >/dev/null 2>&1 || true
    done
    [[ -f $dir/etcd.pid ]] && kill "$(cat "$dir/etcd.pid")" 2>/dev/null || true
    ;;
*)
    echo "unknown action $action" >&2
    exit 2
    ;;
esac

#!/bin/sh
# Redis for docker-compose.yml, with the ACL user `memp` whose password is the compose secret
# redis_password (deploy/make-secrets writes it). The password goes into files under /data, mode
# 600, never onto a command line.
#
#   memp-redis.sh server [redis-server options]   a data node (AOF on, the `default` user off)
#   memp-redis.sh sentinel PRIMARY_HOST           a sentinel watching service `memp`, asking
#                                                 its clients for the same user
#   memp-redis.sh create-cluster HOST...          create the cluster once (3 primaries + replicas)
#   memp-redis.sh check                           healthcheck: PING as `memp`
#   memp-redis.sh check-sentinel                  healthcheck of a sentinel
set -eu
password=$(cat /run/secrets/redis_password)
umask 077
command=$1
shift

case "$command" in
server)
    # `default` is off (no one logs in as it) but keeps its permissions: Redis 7.0 checks them
    # when it replays MULTI/EXEC from the AOF, and without them a restart drops every write.
    cat > /data/memp-auth.conf <<EOF
user default off ~* &* +@all
user memp on >$password ~* &* +@all
masteruser memp
masterauth $password
EOF
    exec redis-server --include /data/memp-auth.conf --appendonly yes --appendfsync everysec \
        --dir /data "$@"
    ;;
sentinel)
    # Sentinel rewrites its configuration (what it learned, the current primary): write it once.
    if [ ! -f /data/sentinel.conf ]; then
        cat > /data/sentinel.conf <<EOF
port 26379
dir /data
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor memp $1 6379 2
sentinel down-after-milliseconds memp ${MEMP_FAILOVER_MS:-5000}
sentinel failover-timeout memp 20000
sentinel parallel-syncs memp 1
sentinel auth-user memp memp
sentinel auth-pass memp $password
user default off ~* &* +@all
user memp on >$password ~* &* +@all
sentinel sentinel-user memp
sentinel sentinel-pass $password
EOF
    fi
    exec redis-server /data/sentinel.conf --sentinel
    ;;
create-cluster)
    export REDISCLI_AUTH="$password"
    for host in "$@"; do
        until redis-cli --user memp -h "$host" ping >/dev/null 2>&1; do sleep 1; done
    done
    if redis-cli --user memp -h "$1" cluster info | grep -q '^cluster_known_nodes:1\r*$'; then
        # redis-cli --cluster create takes addresses, not names.
        addresses=""
        for host in "$@"; do
            addresses="$addresses $(getent hosts "$host" | cut -d' ' -f1):6379"
        done
        # shellcheck disable=SC2086
        redis-cli --user memp --cluster create $addresses --cluster-replicas 1 --cluster-yes
    fi
    until redis-cli --user memp -h "$1" cluster info | grep -q '^cluster_state:ok'; do sleep 1; done
    ;;
check)
    REDISCLI_AUTH="$password" redis-cli --user memp ping | grep -q PONG
    ;;
check-sentinel)
    REDISCLI_AUTH="$password" redis-cli --user memp -p 26379 ping | grep -q PONG
    ;;
*)
    echo "memp-redis.sh: unknown command $command" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# A local PostgreSQL for the lake tests (the DuckLake catalog), used by `make test` and .ci/run.
#
#   scripts/pg.sh start        start the cluster if it is down (installing Debian's postgresql
#                              where it is missing), create the test role; prints the DSN
#   scripts/pg.sh stop         stop the cluster, only if `start` started it
#   scripts/pg.sh run CMD...   start, run CMD with CCE_TEST_PG_DSN, CCE_TEST_PG and
#                              CCE_REQUIRE_PG=1 set,
#                              stop (also when CMD fails); exits with CMD's status
#
# The tests create their own databases (prefix lake_) with the role below and drop them after.
# Needs root (it runs psql as the postgres user), as CI does.
set -euo pipefail
ROLE=cce_test
PASSWORD=cce_test
PORT="${CCE_PG_PORT:-5432}"
MARK=/tmp/cce-pg-started-by-pg-sh
DSN="host=127.0.0.1 port=$PORT user=$ROLE password=$PASSWORD"

cluster() {  # "<version> <name>" of the first cluster
    pg_lsclusters --no-header | awk 'NR==1 {print $1, $2}'
}

start() {
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
    fi
    read -r version name < <(cluster)
    if ! pg_lsclusters --no-header | awk 'NR==1 {print $4}' | grep -q online; then
        pg_ctlcluster "$version" "$name" start
        echo "$version $name" > "$MARK"
    fi
    for _ in $(seq 50); do
        su postgres -c "psql -qAtc 'SELECT 1'" >/dev/null 2>&1 && break
        sleep 0.2
    done
    su postgres -c "psql -qAt" >/dev/null <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  END IF;
END \$\$;
SQL
    echo "$DSN"
}

stop() {
    if [ -f "$MARK" ]; then
        read -r version name < "$MARK"
        pg_ctlcluster "$version" "$name" stop || true
        rm -f "$MARK"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    run)
        shift
        start >/dev/null
        trap stop EXIT
        # (CCE_TEST_PG: the same role for tests/pg.py, with the database it connects to first)
        CCE_TEST_PG_DSN="$DSN" CCE_TEST_PG="$DSN dbname=postgres" CCE_REQUIRE_PG=1 "$@"
        ;;
    *) echo "usage: $0 start|stop|run CMD..." >&2; exit 2 ;;
esac

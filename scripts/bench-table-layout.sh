#!/usr/bin/env bash
# Measures why the sink's tables are sorted by (kafka_partition,
# intDiv(kafka_offset, 65536), identity…) and not by identity alone
# (docs/design.md, The ClickHouse ledger).
#
# On ClickHouse 18.16 (no data-skipping indexes) the only way to bound the
# sink's resume lookup "which offsets >= c of partition P are in the table"
# under an identity-first ORDER BY is partition pruning: PARTITION BY
# (kafka_partition, intDiv(kafka_offset, N)). Then every INSERT writes one
# part per Kafka partition in its block. This script inserts the same
# server-generated usage_events rows (the real DDL from
# schemas/clickhouse/001_tables.sql) into:
#   current   — the shipped layout, blocks mixing 16 Kafka partitions;
#   identity  — identity-first ORDER BY with the (partition, offset bucket)
#               partition key, the same mixed blocks;
#   identity1 — the identity layout with single-partition blocks (what a
#               sink would have to do to keep parts as large as today);
#   current2  — the shipped layout with those single-partition blocks.
# and prints seconds, rows/s and active parts after the inserts.
#
#   deploy/local/clickhouse.sh start
#   scripts/bench-table-layout.sh [inserts] [rows per insert]
set -euo pipefail
cd "$(dirname "$0")/.."

INSERTS=${1:-200}
ROWS=${2:-10000}
PORT=${CLICKHOUSE_PORT:-9000}
DB=layout_bench
C=(clickhouse-client --port "$PORT")

# The usage_events CREATE statement of the migration, with its sort key
# and partition key replaced.
ddl() { # table, partition by, order by
  awk '/^CREATE TABLE IF NOT EXISTS usage_events /,/;$/' schemas/clickhouse/001_tables.sql |
    sed -e "s/^CREATE TABLE IF NOT EXISTS usage_events /CREATE TABLE $DB.$1 /" \
        -e "s/^PARTITION BY .*/PARTITION BY $2/" -e "s/^ORDER BY .*/ORDER BY $3;/" -e 's/;$//'
}

"${C[@]}" -q "DROP DATABASE IF EXISTS $DB"
"${C[@]}" -q "CREATE DATABASE $DB"
"${C[@]}" -q "$(ddl current 'toYYYYMM(kafka_timestamp)' '(kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id)')"
"${C[@]}" -q "$(ddl identity '(kafka_partition, intDiv(kafka_offset, 4194304))' '(customer_id, meter, event_id)')"
"${C[@]}" -q "$(ddl identity1 '(kafka_partition, intDiv(kafka_offset, 4194304))' '(customer_id, meter, event_id)')"
"${C[@]}" -q "$(ddl current2 'toYYYYMM(kafka_timestamp)' '(kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id)')"

# Rows n = from .. from+ROWS-1; mixed: partition n % 16, offset n / 16;
# single: partition p, offsets base .. base+ROWS-1.
select_rows() { # partition expr, offset expr, from
  echo "SELECT 'usage.deduped', toInt32($1), toInt64($2), toDateTime(1767225600 + intDiv(n, 1000)),
    toInt64(1767225600 + intDiv(n, 1000)) * 1000, concat('ev-', toString(n)),
    concat('cust-', toString(cityHash64(n) % 10000)), 'api_calls', toInt64(n % 7 + 1),
    toDateTime(1767225600 + intDiv(n, 1000)), toInt64(1767225600 + intDiv(n, 1000)) * 1000, 'gw',
    ['model'], ['m1'], toDateTime(1767225600 + intDiv(n, 1000)), toInt64(1767225600 + intDiv(n, 1000)) * 1000,
    toInt32(n % 16), toInt64(n)
    FROM (SELECT number + $3 AS n FROM system.numbers LIMIT $ROWS)"
}

run() { # table, mode
  local start end k sql=""
  for ((k = 0; k < INSERTS; k++)); do
    if [ "$2" = mixed ]; then
      sql+="INSERT INTO $DB.$1 $(select_rows 'n % 16' 'intDiv(n, 16)' $((k * ROWS)));"
    else
      local p=$((k % 16)) base=$(((k / 16) * ROWS))
      sql+="INSERT INTO $DB.$1 $(select_rows "$p" "n - $((k * ROWS)) + $base" $((k * ROWS)));"
    fi
  done
  # One client for all the INSERTs: a client per INSERT would time its own
  # start-up.
  start=$(date +%s.%N)
  "${C[@]}" --multiquery <<<"$sql"
  end=$(date +%s.%N)
  awk -v t="$1" -v m="$2" -v s="$start" -v e="$end" -v n=$((INSERTS * ROWS)) -v parts="$("${C[@]}" -q "SELECT count() FROM system.parts WHERE database = '$DB' AND table = '$1' AND active")" \
    'BEGIN { printf "%-9s %-6s blocks: %7.1f s  %8.0f rows/s  %4d active parts\n", t, m, e - s, n / (e - s), parts }'
}

echo "$INSERTS INSERTs of $ROWS rows each into usage_events layouts (ClickHouse $("${C[@]}" -q 'SELECT version()'))"
run current mixed
run identity mixed
run identity1 single
run current2 single
"${C[@]}" -q "DROP DATABASE $DB"

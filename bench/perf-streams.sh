#!/usr/bin/env bash
# Kafka Streams throughput, kaas side by side with Apache Kafka 4.1.1 on this machine (issue 12).
#
#   bench/perf-streams.sh [--rounds R] [--brokers "kaas kafka"] [--keys K] [--per-key N]
#                         [--partitions P] [--cache BYTES] [--out FILE.md | --no-out]
#
# Each round starts every broker fresh (new data dir, loopback ports; brokers alternate A B A B …)
# and, against that one broker: bench/streamsload produce writes K × N keyed records to a
# P-partition input topic (untimed), then the Streams EOS count application of the e2e tests
# (cmd/kaas/testdata/streams-app: exactly_once_v2, commit.interval.ms=100, 2 stream threads,
# groupByKey().count() in RocksDB, compacted changelog) is started and bench/streamsload wait
# times how long until the committed output holds the final count of every key. That time
# includes the JVM start and the first rebalance (a few seconds, the same for both brokers), so
# use an input large enough for processing to dominate. --cache is the app's
# statestore.cache.max.bytes (default 10 MiB, Streams' default: updates of a key merged until the
# commit; 0 writes one changelog and one output record per input record, as the e2e test does).
# The broker's CPU seconds and peak RSS are measured over the processing.
#   kaas   kaas on defaults: every acknowledgement (and transaction marker) fsync'd
#   kafka  Apache Kafka 4.1.1 on defaults: acknowledges from the page cache
# The app and the load generator share the cores with the broker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

keys=1000 per_key=200 partitions=6 rounds=1 brokers="kaas kafka" cache=10485760
out="bench/results/$(date -u +%F)-streams.md"
while [[ $# -gt 0 ]]; do
	case "$1" in
	--keys) keys=$2; shift 2 ;;
	--per-key) per_key=$2; shift 2 ;;
	--partitions) partitions=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--brokers) brokers=$2; shift 2 ;;
	--cache) cache=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--no-out) out=""; shift ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

bench/kafka-tools.sh fetch >/dev/null
cmd/kaas/testdata/streams-app/build.sh
go build -o bin/kaas ./cmd/kaas
go build -o bin/streamsload ./bench/streamsload
work=$(mktemp -d /tmp/kaas-perf-streams.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
app_pid=""
cleanup() {
	[[ -n "$app_pid" ]] && kill -KILL "$app_pid" 2>/dev/null || true
	broker_cleanup
}
trap cleanup EXIT INT TERM

machine=$(machine_note "$work")
started=$(date -u +%FT%TZ)
echo "# $started streams, $machine"
header="| round | broker | input records | output records | seconds | input records/s | broker CPU s | peak RSS MB |"
sep="|---|---|---|---|---|---|---|---|"
rows=()
appdir=cmd/kaas/testdata/streams-app

for ((r = 1; r <= rounds; r++)); do
	for b in $brokers; do
		port=$(free_port)
		broker_start "$b" "$port"
		in="streams-in-$r" outt="streams-out-$r"
		./bin/streamsload produce --brokers 127.0.0.1:$port --in "$in" --out "$outt" --keys "$keys" \
			--per-key "$per_key" --partitions "$partitions" >/dev/null
		cpu0=$(cpu_seconds "$pid"); reset_peak_rss "$pid"
		rm -rf "$work/state"
		java -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile=bench/java/log4j2-tools.properties \
			-cp "$appdir/target/classes:$appdir/target/lib/*" StreamsCount 127.0.0.1:$port "streams-bench-$r" \
			"$in" "$outt" "$work/state" "statestore.cache.max.bytes=$cache" >"$work/app.log" 2>&1 &
		app_pid=$!
		json=$(./bin/streamsload wait --brokers 127.0.0.1:$port --out "$outt" --keys "$keys" --per-key "$per_key" \
			2>"$work/wait.err" | tail -1) || true
		cpu1=$(cpu_seconds "$pid")
		cpu=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN{printf "%.1f", b-a}')
		echo "  $b: broker CPU $cpu0 s before the app, $cpu1 s after" >&2
		rss=$(peak_rss_mb "$pid")
		kill -TERM "$app_pid"; wait "$app_pid" || true; app_pid=""
		if [[ "$json" != "{"* ]]; then
			row="| $r | $b | $((keys * per_key)) | failed: $(tail -1 "$work/wait.err" | tr '|' '/') | | | $cpu | $rss |"
			tail -20 "$work/app.log" >&2
		else
			row=$(echo "$json" | jq -r --arg r "$r" --arg b "$b" --arg cpu "$cpu" --arg rss "$rss" '
				"| \($r) | \($b) | \(.keys * .per_key) | \(.output_records) | \(.seconds * 10 | round / 10) | \(.input_records_per_s | round) | \($cpu) | \($rss) |"')
		fi
		echo "$row"; rows+=("$row")
		broker_stop "$b"
	done
done

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
report() {
	echo "## $started — Kafka Streams EOS count: $machine; load after $load_after"
	echo
	echo "StreamsCount (exactly_once_v2, commit.interval.ms=100, 2 threads, statestore.cache.max.bytes=$cache), $keys keys × $per_key records, $partitions partitions; seconds from the app's start to the last committed count:"
	echo
	echo "$header"; echo "$sep"
	printf '%s\n' "${rows[@]}"
}
echo; report
if [[ -n "$out" ]]; then { echo; report; } >>"$out"; echo "appended to $out"; fi

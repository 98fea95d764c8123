#!/usr/bin/env bash
# Transaction benchmarks of kaas, side by side with Apache Kafka 4.1.1 on this machine (issue 4;
# the driver also serves issue 5's S3/S4).
#
#   bench/perf-txn.sh [--rounds R] [--brokers "kaas kafka"] [--records N] [--size BYTES]
#                     [--partitions P] [--txn-ms "100 10"] [--producers "1 16 64"]
#                     [--load-duration 20s] [--out FILE.md | --no-out]
#
# Each round starts every broker fresh (new data dir, loopback ports; brokers alternate A B A B …
# so drift on the machine hits both alike) and runs, against that one broker:
#   (a) kafka-producer-perf-test --transactional-id perf-txn --transaction-duration-ms T for each
#       T in --txn-ms: N records of BYTES, acks=all, --throughput -1, P partitions. The tool
#       commits (synchronously, flushing first) whenever the open transaction is T ms old, so at
#       T=10 the commit path is most of the work;
#   (b) bench/txnload with each producer count: that many franz-go transactional producers each
#       committing 1-record transactions for --load-duration; commits/s and the EndTxn latency.
# For every workload the broker's CPU seconds are the /proc delta over that workload and its peak
# RSS is VmHWM after resetting it (clear_refs) at the workload's start.
#   kaas   kaas on defaults: every acknowledgement (and every transaction marker) fsync'd
#   kafka  Apache Kafka 4.1.1 on defaults: acknowledges from the page cache
# Note the load generators (a JVM, or txnload) run on the same cores as the broker.
# Output: markdown tables to stdout and appended, with the machine (cores, memory, kernel, fsync
# latency of the data dir's filesystem, load before/after), to bench/results/<date>-txn.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

records=500000 size=1024 partitions=6 rounds=1 brokers="kaas kafka" txn_ms="100 10" producers="1 16 64"
load_duration=20s out="bench/results/$(date -u +%F)-txn.md"
while [[ $# -gt 0 ]]; do
	case "$1" in
	--records) records=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--partitions) partitions=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--brokers) brokers=$2; shift 2 ;;
	--txn-ms) txn_ms=$2; shift 2 ;;
	--producers) producers=$2; shift 2 ;;
	--load-duration) load_duration=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--no-out) out=""; shift ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

bench/kafka-tools.sh fetch >/dev/null
go build -o bin/kaas ./cmd/kaas
go build -o bin/txnload ./bench/txnload
work=$(mktemp -d /tmp/kaas-perf-txn.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
trap broker_cleanup EXIT INT TERM

machine=$(machine_note "$work")
started=$(date -u +%FT%TZ)
echo "# $started transactions, $machine"

perf_header="| round | broker | txn ms | records | size | records/s | MB/s | avg ms | p50 ms | p99 ms | max ms | broker CPU s | peak RSS MB |"
perf_sep="|---|---|---|---|---|---|---|---|---|---|---|---|---|"
load_header="| round | broker | producers | commits | commits/s | EndTxn p50 ms | EndTxn p99 ms | EndTxn max ms | cycle p50 ms | cycle p99 ms | errors | TV | broker CPU s | CPU ms/commit | peak RSS MB |"
load_sep="|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
perf_rows=() load_rows=()

# measure_begin / measure_end: the broker's CPU seconds and peak RSS over one workload.
cpu0=0
measure_begin() { cpu0=$(cpu_seconds "$pid"); reset_peak_rss "$pid"; }
measure_end() { echo "$(awk -v a="$cpu0" -v b="$(cpu_seconds "$pid")" 'BEGIN{printf "%.1f", b-a}') $(peak_rss_mb "$pid")"; }

for ((r = 1; r <= rounds; r++)); do
	for b in $brokers; do
		port=$(free_port)
		broker_start "$b" "$port"
		for t in $txn_ms; do
			bench/kafka-tools.sh run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:$port \
				--create --topic "perf-txn-$t" --partitions "$partitions" >/dev/null
			measure_begin
			summary=$(timeout 900 bench/kafka-tools.sh run org.apache.kafka.tools.ProducerPerformance --topic "perf-txn-$t" \
				--num-records "$records" --record-size "$size" --throughput -1 \
				--transactional-id perf-txn --transaction-duration-ms "$t" \
				--producer-props bootstrap.servers=127.0.0.1:$port acks=all 2>&1 | grep 'records sent' | tail -1) || true
			read -r cpu rss <<<"$(measure_end)"
			if [[ -z "$summary" ]]; then
				row="| $r | $b | $t | $records | $size | failed | | | | | | $cpu | $rss |"
			else
				# "N records sent, X records/sec (Y MB/sec), A ms avg latency, M ms max latency, p50 ms 50th, p95 ms 95th, p99 ms 99th, …"
				row=$(echo "$summary" | awk -v r="$r" -v b="$b" -v t="$t" -v n="$records" -v s="$size" -v cpu="$cpu" -v rss="$rss" '{
					gsub(/[(),]/, "");
					printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", r, b, t, n, s, $4, $6, $8, $16, $22, $12, cpu, rss }')
			fi
			echo "$row"; perf_rows+=("$row")
		done
		for n in $producers; do
			measure_begin
			json=$(timeout 300 ./bin/txnload --brokers 127.0.0.1:$port --producers "$n" --duration "$load_duration" \
				--topic "txnload-$n" --partitions "$partitions" --record-size "$size" --txn-version-check 2>"$work/txnload.err" | tail -1) || true
			read -r cpu rss <<<"$(measure_end)"
			if [[ "$json" != "{"* ]]; then
				row="| $r | $b | $n | failed: $(tail -1 "$work/txnload.err" | tr '|' '/') | | | | | | | | | $cpu | | $rss |"
			else
				row=$(echo "$json" | jq -r --arg r "$r" --arg b "$b" --arg cpu "$cpu" --arg rss "$rss" '
					"| \($r) | \($b) | \(.producers) | \(.commits) | \(.commits_per_s) | \(.end_txn_p50_ms) | \(.end_txn_p99_ms) | \(.end_txn_max_ms) | \(.cycle_p50_ms) | \(.cycle_p99_ms) | \(.errors) | \(.transaction_version) | \($cpu) | \(if .commits > 0 then (($cpu | tonumber) * 1000 / .commits * 1000 | round) / 1000 else "-" end) | \($rss) |"')
				err=$(echo "$json" | jq -r '.first_error // empty')
				[[ -n "$err" ]] && echo "  $b $n producers, first error: $err" >&2
			fi
			echo "$row"; load_rows+=("$row")
		done
		broker_stop "$b"
	done
done

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
report() {
	echo "## $started — transactions: $machine; load after $load_after"
	echo
	echo "kafka-producer-perf-test --transactional-id perf-txn --transaction-duration-ms T, acks=all, $partitions partitions, --throughput -1:"
	echo
	echo "$perf_header"; echo "$perf_sep"
	printf '%s\n' "${perf_rows[@]}"
	echo
	echo "txnload (franz-go, 1-record transactions, ${load_duration} per run, one partition per producer mod $partitions, $size-byte records; TV = finalized transaction.version):"
	echo
	echo "$load_header"; echo "$load_sep"
	printf '%s\n' "${load_rows[@]}"
}
echo; report
if [[ -n "$out" ]]; then { echo; report; } >>"$out"; echo "appended to $out"; fi

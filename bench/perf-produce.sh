#!/usr/bin/env bash
# kafka-producer-perf-test against kaas (and, side by side, Apache Kafka) on this machine.
#
#   bench/perf-produce.sh [--records N] [--size BYTES] [--partitions P] [--rounds R]
#                         [--brokers "kaas kafka kafka-fsync"] [--consume] [--out FILE.md]
#                         [-- extra producer props]
#
# Each round starts every broker fresh (new data dir, loopback ports), creates the topic, runs
# ProducerPerformance (acks=all, idempotence on, --throughput -1), then reads the broker's CPU
# seconds (/proc/<pid>/stat utime+stime) and peak RSS (VmHWM) before stopping it. Brokers
# alternate within a round (A B A B …) so drift on the machine hits both alike.
#   kaas         kaas on defaults: every acknowledgement fsync'd
#                (group.initial.rebalance.delay.ms=0, as the reference broker gets)
#   kafka        Apache Kafka 4.1.1 on defaults: acknowledges from the page cache
#   kafka-fsync  Apache Kafka with log.flush.interval.messages=1 (equal durability)
# --consume: after producing, kafka-consumer-perf-test reads every record back with a consumer
# group (classic protocol) and its throughput and rebalance time are added to the row.
# Output: one markdown row per run, to stdout and (with --out) appended to FILE.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

records=1000000 size=1024 partitions=6 rounds=1 brokers="kaas kafka" out="" extra=() consume=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	--records) records=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--partitions) partitions=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--brokers) brokers=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--consume) consume=1; shift ;;
	--) shift; extra=("$@"); break ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

bench/kafka-tools.sh fetch >/dev/null
go build -o bin/kaas ./cmd/kaas
work=$(mktemp -d /tmp/kaas-perf.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
trap broker_cleanup EXIT INT TERM

header="| broker | records | size | partitions | records/s | MB/s | avg ms | p50 ms | p99 ms | max ms | broker CPU s | peak RSS MB | consume MB/s | consume records/s | rebalance ms |"
echo "# $(date -u +%F) kafka-producer-perf-test, $(nproc) cores, $(uname -r), acks=all idempotent ${extra[*]:-}"
echo "$header"; echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
if [[ -n "$out" ]]; then
	{ echo; echo "## $(date -u +%FT%TZ) — $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, perf-test acks=all idempotent ${extra[*]:-}"; echo; echo "$header"; echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"; } >>"$out"
fi

for ((r = 1; r <= rounds; r++)); do
	for b in $brokers; do
		port=$(free_port)
		broker_start "$b" "$port"
		bench/kafka-tools.sh run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:$port \
			--create --topic perf --partitions "$partitions" >/dev/null
		summary=$(bench/kafka-tools.sh run org.apache.kafka.tools.ProducerPerformance --topic perf \
			--num-records "$records" --record-size "$size" --throughput -1 \
			--producer-props bootstrap.servers=127.0.0.1:$port acks=all enable.idempotence=true "${extra[@]}" 2>&1 | tail -1)
		cons="| - | - | - |"
		if [[ "$consume" == 1 ]]; then
			# Columns: start, end, MB, MB/s, records, records/s, rebalance ms, fetch ms, fetch MB/s, fetch records/s
			cons=$(bench/kafka-tools.sh run org.apache.kafka.tools.ConsumerPerformance --bootstrap-server 127.0.0.1:$port \
				--topic perf --messages "$records" --group "perf-$r-$b" --timeout 60000 --hide-header 2>/dev/null | tail -1 |
				awk -F', *' '{printf "| %s | %s | %s |", $4, $6, $7}')
		fi
		cpu=$(cpu_seconds "$pid"); rss=$(peak_rss_mb "$pid")
		row=$(echo "$summary" | awk -v b="$b" -v n="$records" -v s="$size" -v p="$partitions" -v cpu="$cpu" -v rss="$rss" '{
			gsub(/[(),]/, "");
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s ", b, n, s, p, $4, $6, $8, $16, $22, $12, cpu, rss }')$cons
		echo "$row"
		[[ -n "$out" ]] && echo "$row" >>"$out"
		broker_stop "$b"
	done
done

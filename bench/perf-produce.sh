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
pid=""
cleanup() {
	[[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
	[[ -f "$work/kafka/kafka.pid" ]] && bench/kafka-tools.sh ref-kill "$work/kafka" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
clk=$(getconf CLK_TCK)
cpu_seconds() { awk -v c="$clk" '{printf "%.1f", ($14+$15)/c}' "/proc/$1/stat"; }
peak_rss_mb() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; }

header="| broker | records | size | partitions | records/s | MB/s | avg ms | p50 ms | p99 ms | max ms | broker CPU s | peak RSS MB | consume MB/s | consume records/s | rebalance ms |"
echo "# $(date -u +%F) kafka-producer-perf-test, $(nproc) cores, $(uname -r), acks=all idempotent ${extra[*]:-}"
echo "$header"; echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
if [[ -n "$out" ]]; then
	{ echo; echo "## $(date -u +%FT%TZ) — $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, perf-test acks=all idempotent ${extra[*]:-}"; echo; echo "$header"; echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"; } >>"$out"
fi

for ((r = 1; r <= rounds; r++)); do
	for b in $brokers; do
		port=$(free_port)
		case "$b" in
		kaas)
			rm -rf "$work/kaas"; mkdir -p "$work/kaas"
			./bin/kaas --listeners=127.0.0.1:$port --data.dir="$work/kaas" --metrics.addr= --log.level=warn --group.initial.rebalance.delay.ms=0 \
				>"$work/kaas.log" 2>&1 &
			pid=$!
			for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
			;;
		kafka | kafka-fsync)
			rm -rf "$work/kafka"
			if [[ "$b" == kafka-fsync ]]; then
				KAFKA_REF_EXTRA_PROPS="log.flush.interval.messages=1" bench/kafka-tools.sh ref-start "$port" "$work/kafka" >/dev/null
			else
				bench/kafka-tools.sh ref-start "$port" "$work/kafka" >/dev/null
			fi
			pid=$(cat "$work/kafka/kafka.pid")
			;;
		*) echo "unknown broker $b" >&2; exit 2 ;;
		esac
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
		if [[ "$b" == kaas ]]; then kill -TERM "$pid"; wait "$pid" || true; else bench/kafka-tools.sh ref-stop "$work/kafka" >/dev/null; fi
		pid=""
	done
done

#!/usr/bin/env bash
# A/B of two kaas builds on this machine: a base revision against the working tree, alternating
# (B A B A …) so drift on the machine hits both alike. For checking that a change does not regress
# the transaction and produce paths without a Kafka run.
#
#   bench/ab.sh BASE_REV [ROUNDS] [DURATION]
#
# Workloads per round and build, each on a fresh broker and data dir: bench/txnload with 16 and
# 64 producers (1-record transactions, commits/s) and bench/produceload (4 franz-go producers,
# acks=all, 1 KB, MB/s). Prints one line per run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${1:?base revision}; rounds=${2:-3}; dur=${3:-10s}
work=$(mktemp -d /tmp/kaas-ab.XXXXXX)
trap 'kill -KILL $pid 2>/dev/null || true; git worktree remove --force "$work/base-src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
pid=""
git worktree add -q --detach "$work/base-src" "$base"
(cd "$work/base-src" && go build -o "$work/base" ./cmd/kaas)
go build -o "$work/head" ./cmd/kaas
go build -o "$work/txnload" ./bench/txnload
go build -o "$work/produceload" ./bench/produceload
port=$((20000 + RANDOM % 20000))
run() { # build workload args…
	local bin=$1 what=$2; shift 2
	rm -rf "$work/data"; mkdir -p "$work/data"
	"$work/$bin" --listeners=127.0.0.1:$port --data.dir="$work/data" --metrics.addr= --log.level=warn >"$work/$bin.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
	local out
	out=$("$work/$what" --brokers 127.0.0.1:$port "$@" 2>&1 | tail -1)
	kill -TERM $pid; wait $pid || true; pid=""
	echo "$bin $what $* :: $out"
}
for r in $(seq "$rounds"); do
	for bin in base head; do
		run $bin txnload --producers 16 --duration "$dur"
		run $bin txnload --producers 64 --duration "$dur"
		run $bin produceload --producers 4 --duration "$dur"
	done
done

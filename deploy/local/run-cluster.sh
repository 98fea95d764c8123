#!/usr/bin/env bash
# `make run-cluster`: a real etcd and three kaas brokers on loopback, one shared data dir.
#
#   etcd        client 127.0.0.1:${ETCD_CLIENT_PORT:-2379}, peer :${ETCD_PEER_PORT:-2380}, data ./data-cluster/etcd
#   broker 1-3  Kafka 127.0.0.1:9092-9094, metrics/healthz 127.0.0.1:9645-9647
#               data.dir ./data-cluster/vol (the "shared volume"), logs ./data-cluster/broker-N.log
#
# Ctrl-C (or SIGTERM to this script) stops the brokers first with SIGTERM, so each drains and
# hands its partitions over, then etcd, and waits for all of them. The children run in their
# own sessions (setsid) so the terminal's SIGINT reaches only this script and the order holds;
# otherwise etcd could die before the brokers release, and they would fail-stop.
#
# etcd is Debian's etcd-server binary (`make deps` installs it); the brokers need no etcd
# binary of their own. Environment: KAAS_BIN (skip the build and run that binary),
# KAAS_CLUSTER_DIR (instead of ./data-cluster), KAAS_CLUSTER_ARGS (extra broker flags),
# ETCD_CLIENT_PORT / ETCD_PEER_PORT, GO.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

DIR=${KAAS_CLUSTER_DIR:-./data-cluster}
ETCD_CLIENT_PORT=${ETCD_CLIENT_PORT:-2379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-2380}
ETCD_URL=http://127.0.0.1:$ETCD_CLIENT_PORT
BROKERS=(1 2 3)
# Seconds a broker gets to drain after SIGTERM before it is killed; the k8s manifests give 40+.
DRAIN_WAIT=${DRAIN_WAIT:-45}
read -r -a EXTRA <<<"${KAAS_CLUSTER_ARGS:-}"

log() { echo "run-cluster: $*" >&2; }

ETCD=$(command -v etcd || true)
if [[ -z $ETCD ]]; then
	log "no etcd binary on PATH: run \`make deps\` (installs Debian's etcd-server) and try again"
	exit 1
fi
command -v curl >/dev/null || { log "curl is needed for the health checks"; exit 1; }

BIN=${KAAS_BIN:-}
if [[ -z $BIN ]]; then
	BIN=bin/kaas
	log "building $BIN"
	"${GO:-go}" build -o "$BIN" ./cmd/kaas
fi

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" 9092 9093 9094 9645 9646 9647; do
	if port_busy "$p"; then
		log "127.0.0.1:$p is already in use (another run-cluster, make run, or a system etcd?)"
		exit 1
	fi
done

mkdir -p "$DIR/etcd" "$DIR/vol"

declare -A PID=() # name -> pid
declare -A NAME=() # pid -> name
stopping=0

start() { # name logfile cmd...
	local name=$1 logf=$2
	shift 2
	# setsid execs in place (a background job is not a group leader), so $! is the child's pid.
	setsid "$@" >>"$logf" 2>&1 </dev/null &
	PID[$name]=$!
	NAME[$!]=$name
}

# stop_proc name signal timeout: signal a child and wait for it, SIGKILL after timeout seconds.
stop_proc() {
	local name=$1 sig=$2 timeout=$3 pid=${PID[$1]:-}
	[[ -n $pid ]] || return 0
	kill "-$sig" "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + timeout))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			log "$name (pid $pid) still running ${timeout}s after SIG$sig; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		sleep 0.2
	done
	local rc=0
	wait "$pid" 2>/dev/null || rc=$?
	log "$name stopped (exit $rc)"
	unset "PID[$name]" "NAME[$pid]"
}

shutdown() {
	((stopping)) && return
	stopping=1
	trap '' INT TERM
	log "stopping: brokers (SIGTERM, drain), then etcd"
	local b pids=()
	# Signal all brokers at once so the drains overlap, then wait for each.
	for b in "${BROKERS[@]}"; do
		[[ -n ${PID[broker-$b]:-} ]] && kill -TERM "${PID[broker-$b]}" 2>/dev/null && pids+=("$b")
	done
	for b in "${pids[@]}"; do stop_proc "broker-$b" TERM "$DRAIN_WAIT"; done
	stop_proc etcd TERM 20
	log "all stopped; data kept in $DIR (rm -rf it for a fresh cluster)"
}
trap 'shutdown; exit 130' INT
trap 'shutdown; exit 143' TERM
# A failure of this script itself (set -e) must not leave etcd or brokers behind.
trap 'rc=$?; ((stopping)) || shutdown; exit $rc' EXIT

log "etcd $("$ETCD" --version | head -1 | awk '{print $3}') on $ETCD_URL, data $DIR/etcd, log $DIR/etcd.log"
start etcd "$DIR/etcd.log" "$ETCD" --name kaas-local --data-dir "$DIR/etcd" \
	--listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "kaas-local=http://127.0.0.1:$ETCD_PEER_PORT" --logger zap

# wait_healthy name url seconds: poll url until it answers 2xx; fail early if the process exited.
wait_healthy() {
	local name=$1 url=$2 timeout=$3 deadline=$((SECONDS + $3))
	while :; do
		if ! kill -0 "${PID[$name]}" 2>/dev/null; then
			local rc=0
			wait "${PID[$name]}" 2>/dev/null || rc=$?
			unset "NAME[${PID[$name]}]" "PID[$name]"
			log "$name exited during startup (exit $rc); last lines of its log:"
			return 1
		fi
		curl -fsS -m 1 -o /dev/null "$url" 2>/dev/null && return 0
		if ((SECONDS >= deadline)); then
			log "$name not healthy at $url within ${timeout}s"
			return 1
		fi
		sleep 0.2
	done
}

if ! wait_healthy etcd "$ETCD_URL/health" 30; then
	tail -n 20 "$DIR/etcd.log" >&2
	exit 1
fi
log "etcd ready"

for b in "${BROKERS[@]}"; do
	port=$((9091 + b)) mport=$((9644 + b))
	args=(
		"--broker.id=$b"
		"--listeners=PLAINTEXT://127.0.0.1:$port"
		"--advertised.listeners=PLAINTEXT://127.0.0.1:$port"
		"--metrics.addr=127.0.0.1:$mport"
		"--data.dir=$DIR/vol"
		"--cluster.etcd.endpoints=$ETCD_URL"
		"--cluster.name=kaas"
		"--auto.create.topics.enable=true"
		"${EXTRA[@]}"
	)
	printf '\n===== run-cluster %s: %s %s\n' "$(date -u +%FT%TZ)" "$BIN" "${args[*]}" >>"$DIR/broker-$b.log"
	start "broker-$b" "$DIR/broker-$b.log" "$BIN" "${args[@]}"
done
failed=0
for b in "${BROKERS[@]}"; do
	if wait_healthy "broker-$b" "http://127.0.0.1:$((9644 + b))/healthz" 60; then
		log "broker $b ready on 127.0.0.1:$((9091 + b)) (log $DIR/broker-$b.log)"
	else
		tail -n 5 "$DIR/broker-$b.log" >&2
		failed=1
	fi
done
if ((failed)); then
	log "a broker did not come up; stopping the rest"
	exit 1
fi

cat >&2 <<EOF
run-cluster: up. Bootstrap: 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094
  bench/kafka-tools.sh run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094 --create --topic t --partitions 6 --replication-factor 3
  kcat -b 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094 -L
Ctrl-C stops everything.
EOF

# Supervise: report any child that exits on its own. A broker that fail-stops (exit 3) stays
# down (a real supervisor would restart it; here the log says why). etcd exiting ends it all.
while :; do
	rc=0
	wait -n -p done_pid "${PID[@]}" || rc=$?
	((stopping)) && break
	name=${NAME[${done_pid:-}]:-}
	[[ -n $name ]] || continue
	unset "PID[$name]" "NAME[$done_pid]"
	case $rc in
	3) log "$name fail-stopped (exit 3: lost its etcd lease); see $DIR/$name.log" ;;
	*) log "$name exited on its own (exit $rc); see $DIR/$name.log" ;;
	esac
	if [[ $name == etcd ]]; then
		log "etcd is gone; stopping the brokers"
		exit 1
	fi
	if ((${#PID[@]} == 1)); then
		log "no broker left running; stopping etcd"
		exit 1
	fi
done

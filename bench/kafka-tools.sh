#!/usr/bin/env bash
# Apache Kafka Java tools (and a reference Apache Kafka KRaft broker) for kaas tests and benchmarks.
#
#   bench/kafka-tools.sh fetch                      copy the pinned jars into bench/.kafka-lib/ (idempotent)
#   bench/kafka-tools.sh run <MainClass> [args...]  run a tool, e.g. org.apache.kafka.tools.TopicCommand
#   bench/kafka-tools.sh classpath                  print the classpath (for your own java command line)
#   bench/kafka-tools.sh ref-start <port> <dir>     format + start Apache Kafka on 127.0.0.1:<port>, wait for ready
#   bench/kafka-tools.sh ref-stop <dir>             SIGTERM the reference broker, wait (SIGKILL after 30 s)
#   bench/kafka-tools.sh ref-kill <dir>             SIGKILL the reference broker (crash testing)
#
# Versions are pinned in bench/java/pom.xml (Kafka 4.1.1). Maven's local repository (~/.m2) caches
# downloads, so a second `fetch` after deleting .kafka-lib is quick and offline-friendly.
#
# Environment knobs:
#   JAVA                  java binary (default: java on PATH)
#   KAFKA_TOOLS_HEAP      -Xmx for `run` (default 512m)
#   KAFKA_TOOLS_JIT       full = let `run` use the C2 compiler (benchmarks); default C1 only
#   KAFKA_REF_HEAP        -Xms/-Xmx for the reference broker (default 1g)
#   KAFKA_REF_CONTROLLER_PORT  controller listener port (default <port>+1)
#   KAFKA_REF_EXTRA_PROPS extra broker properties (space-separated key=value)
#   KAFKA_REF_PRODUCTION  1 = keep Kafka's default thread counts (benchmarks); else 2 network + 2 io
#   KAFKA_REF_TIMEOUT     seconds to wait for the reference broker to be ready (default 90)
#   KAFKA_REF_SECURITY_PROTOCOL  PLAINTEXT (default), SASL_PLAINTEXT or SASL_SSL for the client
#                         listener (also the inter-broker one); SASL is SCRAM-SHA-512 only
#   KAFKA_REF_SASL_USER, KAFKA_REF_SASL_PASSWORD  the SCRAM-SHA-512 user created at format time
#                         (kafka-storage format --add-scram; KRaft has no other way to seed the
#                         first user) and used by the broker's own inter-broker clients
#   KAFKA_REF_SSL_KEYSTORE, KAFKA_REF_SSL_TRUSTSTORE  PEM files (chain + unencrypted PKCS#8 key;
#                         CA) for SASL_SSL
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB_DIR="$BENCH_DIR/.kafka-lib"
POM="$BENCH_DIR/java/pom.xml"
JAVA=${JAVA:-java}

die() { echo "kafka-tools.sh: $*" >&2; exit 1; }

usage() {
	sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

pom_hash() { sha256sum "$POM" | cut -d' ' -f1; }

cmd_fetch() {
	local want stamp="$LIB_DIR/.pom.sha256"
	want=$(pom_hash)
	if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && compgen -G "$LIB_DIR/kafka-tools-*.jar" >/dev/null; then
		echo "kafka-tools.sh: $LIB_DIR is up to date ($(ls "$LIB_DIR"/*.jar | wc -l) jars)"
		return 0
	fi
	command -v mvn >/dev/null || die "mvn not found; install Maven (apt-get install maven)"
	local tmp
	tmp=$(mktemp -d "$BENCH_DIR/.kafka-lib.tmp.XXXXXX")
	echo "kafka-tools.sh: resolving $(grep -o '<kafka.version>[^<]*' "$POM" | cut -d'>' -f2) jars into $LIB_DIR"
	# Maven's output goes to a log that is shown only on failure (it is noisy even with -q).
	if ! mvn -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
		-DoutputDirectory="$tmp" -DincludeScope=runtime -Dmdep.overWriteReleases=true >"$tmp.log" 2>&1; then
		tail -n 60 "$tmp.log" >&2
		rm -rf "$tmp" "$tmp.log"
		die "maven could not resolve the jars of $POM"
	fi
	rm -f "$tmp.log"
	if ! compgen -G "$tmp/kafka-tools-*.jar" >/dev/null; then
		rm -rf "$tmp"
		die "maven produced no kafka-tools jar"
	fi
	echo "$want" >"$tmp/.pom.sha256"
	rm -rf "$LIB_DIR"
	mv "$tmp" "$LIB_DIR"
	echo "kafka-tools.sh: fetched $(ls "$LIB_DIR"/*.jar | wc -l) jars into $LIB_DIR"
}

need_lib() {
	compgen -G "$LIB_DIR/kafka-tools-*.jar" >/dev/null ||
		die "$LIB_DIR is missing: run bench/kafka-tools.sh fetch"
}

cmd_run() {
	[[ $# -ge 1 ]] || usage
	need_lib
	# C1 only (TieredStopAtLevel=1) starts the short-lived tools of the tests faster; benchmarks
	# set KAFKA_TOOLS_JIT=full so load generators get the optimising compiler.
	local jit=(-XX:TieredStopAtLevel=1)
	[[ "${KAFKA_TOOLS_JIT:-}" == full ]] && jit=()
	exec "$JAVA" "-Xmx${KAFKA_TOOLS_HEAP:-512m}" -XX:+UseG1GC "${jit[@]}" \
		-Dlog4j2.configurationFile="$BENCH_DIR/java/log4j2-tools.properties" \
		-cp "$LIB_DIR/*" "$@"
}

# pid_alive <pidfile>: true if the pid in the file names a running process.
pid_alive() {
	[[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# tcp_open <port>: true if something accepts connections on 127.0.0.1:<port>.
tcp_open() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

cmd_ref_start() {
	[[ $# -eq 2 ]] || usage
	local port=$1 dir=$2
	[[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number: $port"
	need_lib
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	local cport=${KAFKA_REF_CONTROLLER_PORT:-$((port + 1))}
	local pidf="$dir/kafka.pid" out="$dir/kafka.out" props="$dir/server.properties"
	local proto=${KAFKA_REF_SECURITY_PROTOCOL:-PLAINTEXT} scram=()
	case "$proto" in
	PLAINTEXT | SASL_PLAINTEXT | SASL_SSL) ;;
	*) die "KAFKA_REF_SECURITY_PROTOCOL=$proto: want PLAINTEXT, SASL_PLAINTEXT or SASL_SSL" ;;
	esac
	if pid_alive "$pidf"; then
		die "reference broker already running in $dir (pid $(cat "$pidf"))"
	fi
	tcp_open "$port" && die "127.0.0.1:$port is already in use"
	cat >"$props" <<-EOF
		# written by bench/kafka-tools.sh ref-start; single-node KRaft, loopback only
		process.roles=broker,controller
		node.id=1
		controller.quorum.voters=1@127.0.0.1:$cport
		listeners=$proto://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
		advertised.listeners=$proto://127.0.0.1:$port
		controller.listener.names=CONTROLLER
		inter.broker.listener.name=$proto
		listener.security.protocol.map=CONTROLLER:PLAINTEXT,$proto:$proto
		log.dirs=$dir/logs
		num.partitions=1
		auto.create.topics.enable=true
		offsets.topic.replication.factor=1
		offsets.topic.num.partitions=4
		transaction.state.log.replication.factor=1
		transaction.state.log.min.isr=1
		transaction.state.log.num.partitions=4
		share.coordinator.state.topic.replication.factor=1
		share.coordinator.state.topic.min.isr=1
		group.initial.rebalance.delay.ms=0
		# After a kill -9 the controller refuses the new broker incarnation until the old
		# registration's session expires (9 s by default): shorter sessions speed up crash tests.
		broker.session.timeout.ms=3000
		broker.heartbeat.interval.ms=500
	EOF
	# The e2e tests run a small broker (2+2 threads); benchmarks keep Kafka's production defaults
	# (num.network.threads=3, num.io.threads=8) with KAFKA_REF_PRODUCTION=1.
	if [[ "${KAFKA_REF_PRODUCTION:-0}" != 1 ]]; then
		printf 'num.network.threads=2\nnum.io.threads=2\n' >>"$props"
	fi
	# KAFKA_REF_EXTRA_PROPS: extra server properties, space-separated key=value (e.g. the
	# equal-durability run: log.flush.interval.messages=1).
	for kv in ${KAFKA_REF_EXTRA_PROPS:-}; do echo "$kv" >>"$props"; done
	if [[ "$proto" == SASL_* ]]; then
		local user=${KAFKA_REF_SASL_USER:?KAFKA_REF_SASL_USER is required with $proto}
		local pw=${KAFKA_REF_SASL_PASSWORD:?KAFKA_REF_SASL_PASSWORD is required with $proto}
		local lname
		lname=$(echo "$proto" | tr 'A-Z' 'a-z')
		cat >>"$props" <<-EOF
			sasl.enabled.mechanisms=SCRAM-SHA-512
			sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
			listener.name.$lname.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$user" password="$pw";
		EOF
		scram=(--add-scram "SCRAM-SHA-512=[name=$user,password=$pw]")
	fi
	if [[ "$proto" == SASL_SSL ]]; then
		cat >>"$props" <<-EOF
			ssl.keystore.type=PEM
			ssl.keystore.location=${KAFKA_REF_SSL_KEYSTORE:?KAFKA_REF_SSL_KEYSTORE is required with SASL_SSL}
			ssl.truststore.type=PEM
			ssl.truststore.location=${KAFKA_REF_SSL_TRUSTSTORE:?KAFKA_REF_SSL_TRUSTSTORE is required with SASL_SSL}
		EOF
	fi
	if [[ ! -f "$dir/logs/meta.properties" ]]; then
		# Static voters (controller.quorum.voters), so no --standalone. Re-running ref-start on a
		# formatted dir restarts the same cluster (used by the kill -9 tests).
		local cid
		cid=$(KAFKA_TOOLS_HEAP=256m cmd_run_sub kafka.tools.StorageTool random-uuid)
		KAFKA_TOOLS_HEAP=256m cmd_run_sub kafka.tools.StorageTool format -t "$cid" -c "$props" "${scram[@]}" >"$dir/format.out" 2>&1 ||
			{ cat "$dir/format.out" >&2; die "cannot format KRaft storage in $dir"; }
	fi
	[[ -f "$out" ]] && mv -f "$out" "$out.prev"
	local heap=${KAFKA_REF_HEAP:-1g}
	# setsid: own process group, so a Ctrl-C in the caller's terminal does not reach it.
	setsid "$JAVA" "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC \
		-Dlog4j2.configurationFile="$BENCH_DIR/java/log4j2-broker.properties" \
		-cp "$LIB_DIR/*" kafka.Kafka "$props" </dev/null >"$out" 2>&1 &
	echo $! >"$pidf"
	local deadline=$((SECONDS + ${KAFKA_REF_TIMEOUT:-90}))
	while :; do
		if ! pid_alive "$pidf"; then
			tail -n 40 "$out" >&2 || true
			die "reference broker exited during startup (log: $out)"
		fi
		# "Kafka Server started" is logged by KafkaRaftServer once broker and controller are up.
		if grep -q 'Kafka Server started' "$out" 2>/dev/null && tcp_open "$port"; then
			break
		fi
		if ((SECONDS >= deadline)); then
			tail -n 40 "$out" >&2 || true
			die "reference broker not ready after ${KAFKA_REF_TIMEOUT:-90}s (log: $out)"
		fi
		sleep 0.2
	done
	echo "kafka-tools.sh: reference Apache Kafka ready on 127.0.0.1:$port (pid $(cat "$pidf"), dir $dir)"
}

# cmd_run_sub: like cmd_run, but in a subshell so it returns instead of exec-ing over us.
cmd_run_sub() { (cmd_run "$@"); }

cmd_ref_stop() {
	[[ $# -eq 1 || $# -eq 2 ]] || usage
	local dir=$1 sig=${2:-TERM}
	local pidf="$dir/kafka.pid"
	if ! pid_alive "$pidf"; then
		rm -f "$pidf"
		echo "kafka-tools.sh: no reference broker running in $dir"
		return 0
	fi
	local pid
	pid=$(cat "$pidf")
	kill "-$sig" "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 30))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			echo "kafka-tools.sh: pid $pid ignored SIG$sig for 30s; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
			deadline=$((SECONDS + 30))
		fi
		sleep 0.1
	done
	rm -f "$pidf"
	echo "kafka-tools.sh: reference broker (pid $pid) stopped with SIG$sig"
}

main() {
	[[ $# -ge 1 ]] || usage
	local sub=$1
	shift
	case "$sub" in
	fetch) cmd_fetch "$@" ;;
	run) cmd_run "$@" ;;
	classpath) need_lib && echo "$LIB_DIR/*" ;;
	ref-start) cmd_ref_start "$@" ;;
	ref-stop) cmd_ref_stop "$@" ;;
	ref-kill) [[ $# -eq 1 ]] || usage; cmd_ref_stop "$1" KILL ;;
	-h | --help | help) usage ;;
	*) echo "kafka-tools.sh: unknown command: $sub" >&2; usage ;;
	esac
}

main "$@"

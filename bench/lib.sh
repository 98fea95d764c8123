# Shared shell functions of the side-by-side benchmark scripts (bench/run, perf-produce.sh,
# perf-txn.sh). Sourced, not run. The caller has cd'ed to the repository root and sets `work` (a
# scratch dir it removes on exit) before calling broker_start.
#
#   broker_start <kaas|kafka|kafka-fsync> <port>   fresh data dir under $work, sets $pid; kaas is
#                                                  $KAAS_BIN (default ./bin/kaas)
#   broker_start kaas-cluster <port>               a real etcd (Debian's etcd binary) and 3 kaas on
#                                                  one data dir; broker 1 on <port>; sets $pid
#                                                  (broker 1), $bootstrap_override (the 3 seeds),
#                                                  cluster_pids[1..3], cluster_ports[1..3]
#   cluster_broker_start <id>                      (re)start broker id of the running cluster
#   cluster_restart_dead                           restart whichever cluster brokers exited
#   cluster_wait_balanced <s>                      all 3 listed and the txn slots spread ±1
#   broker_pids                                    every process of the broker under test (CPU, RSS)
#   broker_stop <broker>                           graceful stop of the broker started last
#   broker_cleanup                                 for the EXIT trap: kill whatever is left
#   cpu_seconds <pid>, peak_rss_mb <pid>           from /proc (utime+stime; VmHWM)
#   reset_peak_rss <pid>                           VmHWM := current RSS (clear_refs 5), so one
#                                                  broker can be measured per workload
#   machine_note [dir]                             one line: cores, memory, kernel, load, fsync
#                                                  latency of the filesystem holding dir
#   disk_probe <dir> <MiB>                         "fsync_p50_ms fsync_p99_ms seq_fsync_MBps"
#   security_setup <plaintext|sasl_plaintext|sasl_ssl> <dir>
#                                                  the listener type broker_start gives both
#                                                  brokers (SCRAM-SHA-512 user, TLS material made
#                                                  here) and $sec_client_cfg, the Java clients'
#                                                  client.properties ("" for plaintext)

# free_port: a loopback port p with p+1 free too (the reference Kafka broker's controller listens
# on port+1). Still a race with other processes' ephemeral ports; bench/run retries a failed start.
free_port() {
	python3 -c '
import socket
for _ in range(50):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1))
    except OSError:
        a.close(); continue
    a.close(); b.close(); print(p); break
'
}

clk=$(getconf CLK_TCK)
cpu_seconds() { awk -v c="$clk" '{printf "%.1f", ($14+$15)/c}' "/proc/$1/stat"; }
peak_rss_mb() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
# Writing 5 to clear_refs resets the peak RSS to the current RSS (Linux 4.0+, own processes only).
reset_peak_rss() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; }

pid=""
# kaas-cluster state (S8): broker id -> pid / Kafka port, the etcd process, and the seed list
# the Java tools and Go drivers use instead of 127.0.0.1:$port.
cluster_pids=() cluster_ports=() etcd_pid="" etcd_url="" bootstrap_override=""
# Session settings of the cluster brokers: the process tests' 3000/1000/300 by default, so S8's
# failover figures are comparable with the tests' bound; KAAS_S8_SESSION=6000/2000/500 for the
# production defaults.
s8_session=${KAAS_S8_SESSION:-3000/1000/300}

cluster_broker_start() {
	local id=$1 st hb fm
	IFS=/ read -r st hb fm <<<"$s8_session"
	"${KAAS_BIN:-./bin/kaas}" --broker.id="$id" --listeners="127.0.0.1:${cluster_ports[id]}" \
		--advertised.listeners="PLAINTEXT://127.0.0.1:${cluster_ports[id]}" --data.dir="$work/cluster/vol" \
		--metrics.addr= --log.level=warn --group.initial.rebalance.delay.ms=0 \
		--cluster.etcd.endpoints="$etcd_url" --cluster.name=bench --cluster.session.timeout.ms="$st" \
		--cluster.session.heartbeat.ms="$hb" --cluster.fence.margin.ms="$fm" >>"$work/cluster/broker-$id.log" 2>&1 &
	cluster_pids[id]=$!
}

# cluster_start <port>: etcd on two free ports, then brokers 1-3 (broker 1 on <port>), then
# waits until every broker lists all three (bench/failover ready, built by bench/run).
cluster_start() {
	local port=$1 etcd cport pport id
	etcd=$(command -v etcd) || { echo "kaas-cluster needs Debian's etcd-server (make deps)" >&2; return 1; }
	rm -rf "$work/cluster"; mkdir -p "$work/cluster/vol"
	cport=$(free_port) pport=$((cport + 1)) etcd_url=http://127.0.0.1:$cport
	"$etcd" --name bench --data-dir "$work/cluster/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
		--listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
		--initial-cluster "bench=http://127.0.0.1:$pport" --logger zap >"$work/cluster/etcd.log" 2>&1 &
	etcd_pid=$!
	for _ in $(seq 100); do curl -fsS -m 1 "$etcd_url/health" 2>/dev/null | grep -q '"health":"true"' && break; sleep 0.1; done
	curl -fsS -m 1 "$etcd_url/health" 2>/dev/null | grep -q '"health":"true"' || { tail -5 "$work/cluster/etcd.log" >&2; return 1; }
	cluster_ports=("" "$port" "$(free_port)" "$(free_port)")
	for id in 1 2 3; do cluster_broker_start "$id"; done
	bootstrap_override="127.0.0.1:${cluster_ports[1]},127.0.0.1:${cluster_ports[2]},127.0.0.1:${cluster_ports[3]}"
	if ! cluster_wait_ready 60; then
		for id in 1 2 3; do echo "--- broker $id:" >&2; tail -5 "$work/cluster/broker-$id.log" >&2; done
		cluster_stop
		return 1
	fi
	pid=${cluster_pids[1]}
}

# cluster_wait_ready <seconds>: every broker lists all three; gives up early when a broker died.
cluster_wait_ready() {
	local deadline=$((SECONDS + $1)) id
	while ((SECONDS < deadline)); do
		for id in 1 2 3; do
			kill -0 "${cluster_pids[id]}" 2>/dev/null || { echo "kaas-cluster: broker $id exited" >&2; return 1; }
		done
		"$work/bin/failover" ready --brokers "$bootstrap_override" --n 3 --timeout 2s 2>/dev/null && return 0
	done
	echo "kaas-cluster: not ready within $1 s" >&2
	return 1
}

# cluster_wait_balanced <seconds>: cluster_wait_ready, then the 50 transaction slots spread
# ±1 over the 3 brokers (the first broker up holds them all until the controller's smoothing
# moves them; S4c measures coordinators, so it waits for that).
cluster_wait_balanced() {
	cluster_wait_ready "$1" || return 1
	"$work/bin/failover" ready --brokers "$bootstrap_override" --n 3 --txn-balanced --timeout "${1}s" 2>&1 >/dev/null | tail -1 >&2
	return "${PIPESTATUS[0]}"
}

# cluster_restart_dead: start again every broker of the cluster whose process has exited.
cluster_restart_dead() {
	local id
	for id in 1 2 3; do
		if ! kill -0 "${cluster_pids[id]}" 2>/dev/null; then
			wait "${cluster_pids[id]}" 2>/dev/null || true
			cluster_broker_start "$id"
		fi
	done
}

# cluster_stop: SIGTERM every broker (their drains overlap), wait, then etcd.
cluster_stop() {
	local id
	for id in 1 2 3; do [[ -n ${cluster_pids[id]:-} ]] && kill -TERM "${cluster_pids[id]}" 2>/dev/null; done
	for id in 1 2 3; do [[ -n ${cluster_pids[id]:-} ]] && { wait "${cluster_pids[id]}" 2>/dev/null || true; }; done
	[[ -n $etcd_pid ]] && { kill -TERM "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null || true; }
	cluster_pids=() etcd_pid="" bootstrap_override="" pid=""
}

broker_pids() {
	if [[ -n $etcd_pid ]]; then echo "${cluster_pids[@]}" "$etcd_pid"; else echo "$pid"; fi
}

bench_security=plaintext sec_client_cfg="" sec_keystore="" sec_user=bench sec_password=""

# security_setup <mode> <dir>: S1-style measurements over SASL listeners. Both brokers get one
# listener of that type (SASL is SCRAM-SHA-512, the mechanism the Java tools' client.properties
# of an operator usually names): kaas through `kaas credentials add` before it starts, Apache
# Kafka through `kafka-storage format --add-scram` (bench/kafka-tools.sh). The TLS material (a CA
# and a server certificate for 127.0.0.1, EC P-256, valid two days) is generated here for this
# run only and removed with $work; the Java clients trust the CA as a PEM truststore.
security_setup() {
	bench_security=$1
	local dir=$2 proto
	case "$bench_security" in
	plaintext) return 0 ;;
	sasl_plaintext) proto=SASL_PLAINTEXT ;;
	sasl_ssl) proto=SASL_SSL ;;
	*) echo "security_setup: unknown mode $bench_security (plaintext, sasl_plaintext or sasl_ssl)" >&2; return 2 ;;
	esac
	mkdir -p "$dir"
	sec_password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
	sec_client_cfg="$dir/client.properties"
	{
		echo "security.protocol=$proto"
		echo "sasl.mechanism=SCRAM-SHA-512"
		echo "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$sec_user\" password=\"$sec_password\";"
	} >"$sec_client_cfg"
	export KAFKA_REF_SECURITY_PROTOCOL=$proto KAFKA_REF_SASL_USER=$sec_user KAFKA_REF_SASL_PASSWORD=$sec_password
	if [[ "$bench_security" == sasl_ssl ]]; then
		command -v openssl >/dev/null || { echo "security_setup: sasl_ssl needs openssl" >&2; return 1; }
		local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
		openssl req -x509 "${ec[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 2 -subj /CN=kaas-bench-CA \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
		openssl req "${ec[@]}" -keyout "$dir/server.key" -out "$dir/server.csr" -subj /CN=localhost 2>/dev/null
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n' >"$dir/server.ext"
		openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
			-extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
		sec_keystore="$dir/keystore.pem"
		cat "$dir/server.pem" "$dir/server.key" >"$sec_keystore"
		chmod 600 "$sec_keystore" "$dir/ca.key" "$dir/server.key"
		printf 'ssl.truststore.type=PEM\nssl.truststore.location=%s\n' "$dir/ca.pem" >>"$sec_client_cfg"
		export KAFKA_REF_SSL_KEYSTORE=$sec_keystore KAFKA_REF_SSL_TRUSTSTORE=$dir/ca.pem
	fi
}

broker_start() {
	local b=$1 port=$2
	case "$b" in
	kaas-cluster) cluster_start "$port" ;;
	kaas)
		rm -rf "$work/kaas"; mkdir -p "$work/kaas"
		local listen=127.0.0.1:$port sec_args=()
		case "$bench_security" in
		sasl_plaintext) listen=SASL_PLAINTEXT://127.0.0.1:$port ;;
		sasl_ssl) listen=SASL_SSL://127.0.0.1:$port sec_args=(--ssl.keystore.location="$sec_keystore") ;;
		esac
		if [[ "$bench_security" != plaintext ]]; then
			sec_args+=(--sasl.enabled.mechanisms=SCRAM-SHA-512)
			"${KAAS_BIN:-./bin/kaas}" credentials add --data.dir="$work/kaas" --user="$sec_user" --mechanism=SCRAM-SHA-512 \
				--password="$sec_password" >"$work/kaas-credentials.log" 2>&1 || { cat "$work/kaas-credentials.log" >&2; return 1; }
		fi
		# KAAS_EXTRA_FLAGS: more flags, space-separated, after the defaults (a later flag wins):
		# S9 turns the cleaner's log line on with --log.level=info.
		# shellcheck disable=SC2086
		"${KAAS_BIN:-./bin/kaas}" --listeners="$listen" --data.dir="$work/kaas" --metrics.addr= --log.level=warn --group.initial.rebalance.delay.ms=0 \
			"${sec_args[@]}" ${KAAS_EXTRA_FLAGS:-} >"$work/kaas.log" 2>&1 &
		pid=$!
		for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && return 0; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
		pid=""
		return 1
		;;
	kafka | kafka-fsync)
		rm -rf "$work/kafka"
		if [[ "$b" == kafka-fsync ]]; then
			KAFKA_REF_EXTRA_PROPS="${KAFKA_REF_EXTRA_PROPS:-} log.flush.interval.messages=1" bench/kafka-tools.sh ref-start "$port" "$work/kafka" >/dev/null || return 1
		else
			bench/kafka-tools.sh ref-start "$port" "$work/kafka" >/dev/null || return 1
		fi
		pid=$(cat "$work/kafka/kafka.pid")
		;;
	*) echo "unknown broker $b" >&2; exit 2 ;;
	esac
}

broker_stop() {
	if [[ "$1" == kaas-cluster ]]; then cluster_stop; return; fi
	if [[ "$1" == kaas ]]; then kill -TERM "$pid"; wait "$pid" || true; else bench/kafka-tools.sh ref-stop "$work/kafka" >/dev/null; fi
	pid=""
}

broker_cleanup() {
	[[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
	local p
	for p in "${cluster_pids[@]}" "$etcd_pid"; do [[ -n $p ]] && kill -KILL "$p" 2>/dev/null || true; done
	[[ -f "$work/kafka/kafka.pid" ]] && bench/kafka-tools.sh ref-kill "$work/kafka" >/dev/null 2>&1 || true
	rm -rf "$work"
}

# fsync_latency_ms <dir>: median and p99 of 200 × (4 KiB write + fsync) on dir's filesystem.
fsync_latency_ms() {
	python3 - "$1" <<-'EOF'
		import os, sys, time
		p = os.path.join(sys.argv[1], ".fsync-probe")
		fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
		lat = []
		for _ in range(200):
		    os.write(fd, b"x" * 4096)
		    t = time.perf_counter(); os.fsync(fd); lat.append((time.perf_counter() - t) * 1000)
		os.close(fd); os.unlink(p)
		lat.sort()
		print("fsync p50 %.2f ms p99 %.2f ms" % (lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]))
	EOF
}

machine_note() {
	local dir=${1:-/tmp}
	echo "$(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, kernel $(uname -r), $(df -T "$dir" | awk 'NR==2{print $2}') $(fsync_latency_ms "$dir"), load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# disk_probe <dir> <MiB>: the data dir's filesystem as the side-by-side harness (bench/run) sees
# it. Prints "p50_ms p99_ms seq_MBps": the latency of 300 × (16 KiB write + fsync) on one file,
# and the bandwidth of writing <MiB> × 1 MiB with fdatasync after each MiB (the ceiling an
# fsync-per-batch broker can reach on this disk; S7 compares its produce rate with it).
disk_probe() {
	python3 - "$1" "$2" <<-'EOF2'
		import os, sys, time
		d, mib = sys.argv[1], int(sys.argv[2])
		p = os.path.join(d, ".disk-probe")
		fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
		blk = os.urandom(16384)
		lat = []
		for _ in range(300):
		    t = time.perf_counter(); os.write(fd, blk); os.fsync(fd); lat.append((time.perf_counter() - t) * 1000)
		os.ftruncate(fd, 0); os.fsync(fd)
		lat.sort()
		big = os.urandom(1 << 20)
		t0 = time.perf_counter(); n = 0
		while n < mib and (n < 16 or time.perf_counter() - t0 < 10):
		    os.write(fd, big); os.fdatasync(fd); n += 1
		bw = n * 1.048576 / (time.perf_counter() - t0)
		os.close(fd); os.unlink(p)
		print("%.2f %.2f %.0f" % (lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1], bw))
	EOF2
}

#!/usr/bin/env bash
# Builds the Kafka Streams application of cmd/kaas/e2e_streams_test.go into target/:
# target/lib (its jars, from Maven Central through ~/.m2) and target/classes (javac).
# Idempotent: a second run with the same pom.xml and StreamsCount.java does nothing.
# Called by the test itself and by .ci/deps.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
want=$(cat pom.xml StreamsCount.java | sha256sum | cut -d' ' -f1)
stamp=target/.sha256
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] && [[ -f target/classes/StreamsCount.class ]]; then
	exit 0
fi
command -v mvn >/dev/null || { echo "streams-app: mvn not found (apt-get install maven)" >&2; exit 1; }
rm -rf target
mkdir -p target
if ! mvn -B -Dstyle.color=never -f pom.xml dependency:copy-dependencies \
	-DoutputDirectory=target/lib -DincludeScope=runtime >target/mvn.log 2>&1; then
	tail -n 60 target/mvn.log >&2
	exit 1
fi
javac -nowarn -d target/classes -cp 'target/lib/*' StreamsCount.java
echo "$want" >"$stamp"
echo "streams-app: built $(pwd)/target ($(ls target/lib | wc -l) jars)"

#!/usr/bin/env bash
# Assembles the pinned Apache Kafka release (broker + KRaft controller, CLI tools, Java client,
# log4j2 runtime) from Maven Central into one flat classpath directory, and prints that
# directory's path on stdout.
#
#   bench/kafka/assemble.sh            -> ${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}/kafka/<version>
#   KAFKA_VERSION=4.3.0 bench/kafka/assemble.sh   (another 4.x release)
#   KAFKA_PART=streams KAFKA_POM=bench/kafka/streams/pom.xml bench/kafka/assemble.sh
#       -> .../kafka/<version>-streams: an extra classpath used beside the main one (Streams)
#   KAFKA_PART=connect-file KAFKA_POM=bench/kafka/connect-file/pom.xml bench/kafka/assemble.sh
#       -> .../kafka/<version>-connect-file: Connect's FileStream connectors, likewise
#
# The result is cached: a stamp file records the hash of pom.xml and the version, so a second
# run costs milliseconds and runs no Maven at all. Concurrent runs (the lead and the
# developers share TIDALMQ_CACHE_DIR) serialise on a lock file. Only Maven Central is used:
# Maven resolves through its ordinary client and ~/.m2 (or MAVEN_REPO_LOCAL if set).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
pom="${KAFKA_POM:-$here/pom.xml}"
part=${KAFKA_PART:-}
default_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom" | head -n1)
version=${KAFKA_VERSION:-$default_version}
cache_root=${TIDALMQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tidalmq}
dest="$cache_root/kafka/$version${part:+-$part}"
stamp="$dest/.assembled"
want="version=$version pom=$(sha256sum "$pom" | cut -d' ' -f1)"

log() { printf 'assemble: %s\n' "$*" >&2; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$dest"
  exit 0
fi

for cmd in mvn java flock; do
  command -v "$cmd" >/dev/null || { log "missing '$cmd' on PATH"; exit 2; }
done

mkdir -p "$cache_root/kafka"
exec 9>"$cache_root/kafka/.assemble-$version${part:+-$part}.lock"
flock 9
# Another process may have finished while this one waited for the lock.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$dest"
  exit 0
fi

log "resolving Apache Kafka $version${part:+ ($part)} from Maven Central into $dest"
start=$(date +%s)
tmp=$(mktemp -d "$cache_root/kafka/.assemble-$version${part:+-$part}.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
mvn_args=(-B -q -f "$pom" "-Dkafka.version=$version" "-Dkafka.out=$tmp/lib")
if [ -n "${MAVEN_REPO_LOCAL:-}" ]; then
  mvn_args+=("-Dmaven.repo.local=$MAVEN_REPO_LOCAL")
fi
if ! mvn "${mvn_args[@]}" generate-resources >"$tmp/mvn.log" 2>&1; then
  tail -n 40 "$tmp/mvn.log" >&2
  log "maven failed (full log above, last 40 lines)"
  exit 1
fi

# Sanity: the jars every later step relies on must be there.
if [ -n "$part" ]; then
  # the part's own jar: kafka-streams-<version>, connect-file-<version>
  expected=("$part-$version")
  [ -f "$tmp/lib/$part-$version.jar" ] || expected=("kafka-$part-$version")
else
  expected=("kafka_2.13-$version" "kafka-server-$version" "kafka-tools-$version"
    "kafka-clients-$version" "kafka-storage-$version" "kafka-metadata-$version")
fi
for jar in "${expected[@]}"; do
  [ -f "$tmp/lib/$jar.jar" ] || { log "expected $jar.jar in the resolved classpath"; exit 1; }
done
[ -n "$part" ] || ls "$tmp/lib"/log4j-core-*.jar "$tmp/lib"/log4j-slf4j-impl-*.jar >/dev/null

printf '%s\n' "$version" >"$tmp/VERSION"
mv "$tmp/mvn.log" "$tmp/assemble.log"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
printf '%s\n' "$want" >"$stamp"
log "done in $(($(date +%s) - start)) s: $(find "$dest/lib" -name '*.jar' | wc -l) jars, $(du -sh "$dest/lib" | cut -f1)"
echo "$dest"

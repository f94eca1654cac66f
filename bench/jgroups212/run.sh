#!/usr/bin/env bash
# run.sh FLAGS: JGroups 2.12 (Debian's libjgroups-java, /usr/share/java/jgroups.jar) with Perf212, all members
# in one JVM, on 127.0.0.1 only (bind address, TTL 0, a fresh 239.x group and free port; its udp.xml keeps the
# diagnostics handler off). Flags: -members -senders -count -warmup -size -mode multicast|unicast.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
jar=${JGROUPS212_JAR:-/usr/share/java/jgroups.jar}
[ -f "$jar" ] || { echo "run.sh: $jar not found (apt-get install libjgroups-java)" >&2; exit 2; }
cls=${TMPDIR:-/tmp}/strata-jg212-driver
if [ ! -f "$cls/Perf212.class" ] || [ "$here/Perf212.java" -nt "$cls/Perf212.class" ]; then
  mkdir -p "$cls"; javac -nowarn -cp "$jar" -d "$cls" "$here/Perf212.java" 2>&1 | grep -v '^Note:' || true
fi
maddr=$(python3 -c 'import random; print("239.%d.%d.%d" % (random.randint(1,250), random.randint(0,255), random.randint(1,254)))')
mport=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
exec java -Xms1g -Xmx1g -Djava.net.preferIPv4Stack=true -Djgroups.bind_addr=127.0.0.1 -Djgroups.udp.ip_ttl=0 \
  -Djgroups.udp.mcast_addr="$maddr" -Djgroups.udp.mcast_port="$mport" -cp "$jar:$cls" Perf212 "$@"

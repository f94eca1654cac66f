#!/usr/bin/env bash
# sidebyside.sh: `stackdemo perf` next to JGroups 5.5.6, interleaved, on
# 127.0.0.1 only; prints per shape the median msgs/s of each and the ratio.
#
#   bench/sidebyside.sh            # RUNS=5 rounds of every shape
#   RUNS=3 SHAPES="mc2x1 uc2" bench/sidebyside.sh
#
# Shapes (1000-byte messages, no application window on either side: strata
# is paced by UFC/MFC, JGroups by its own UFC/MFC):
#   mc2x1       2 members in one process, 1 sender, multicast: mean per member
#   mc2x1-join  the same with one process (JVM) per member: the receiver
#   mc4x4       4 members in one process, all sending, multicast: total
#   uc2         2 members in one process, unicast to each other: mean per member
#
# STACK=tcp runs configs/tcp.toml against JGroups 5's stock tcp.xml instead
# of configs/udp.toml against udp.xml (JGroups 5 only).
#
# JGroups comes from ../shared/bench/jgroups5/run.sh (JGROUPS5_RUN to
# override); it is used from there, never copied here. JGROUPS=2.12 runs
# Debian's JGroups 2.12 (libjgroups-java) through bench/jgroups212 instead
# (shapes mc2x1, mc4x4, uc2). Needs go, java,
# javac and python3. The machine is noisy: compare the ratios of one run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jg=${JGROUPS5_RUN:-$root/../shared/bench/jgroups5/run.sh}
label=jgroups5
if [ "${JGROUPS:-5}" = 2.12 ]; then
  # JGroups 2.12 from Debian (apt-get install libjgroups-java) with our own
  # driver, bench/jgroups212 (one JVM; no -join shape).
  jg=$root/bench/jgroups212/run.sh
  label=jgroups2.12
fi
scfg=() jcfg=()
if [ "${STACK:-udp}" = tcp ]; then
  scfg=(-config "$root/configs/tcp.toml") jcfg=(-config tcp.xml) label=$label-tcp
fi
runs=${RUNS:-5}
shapes=${SHAPES:-mc2x1 mc2x1-join mc4x4 uc2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/stackdemo
(cd "$root" && go build -o "$bin" ./cmd/stackdemo)

flags() {
  case $1 in
    mc2x1 | mc2x1-join) echo "-members 2 -senders 1 -count 200000 -size 1000" ;;
    mc4x4) echo "-members 4 -count 50000 -size 1000" ;;
    uc2) echo "-members 2 -mode unicast -count 200000 -size 1000" ;;
  esac
}

# strata_metric SHAPE FILE...: the shape's figure from perf's JSON output.
strata_metric() {
  local shape=$1; shift
  python3 - "$shape" "$@" <<'PY'
import json, sys
shape, files = sys.argv[1], sys.argv[2:]
rs = [json.load(open(f)) for f in files]
if shape == "mc4x4":
    print(int(rs[0]["total_msgs_per_sec"]))
elif shape == "mc2x1-join":
    print(int(max(m["msgs_per_sec"] for r in rs for m in r["per_member"])))
else:
    ms = rs[0]["per_member"]
    print(int(sum(m["msgs_per_sec"] for m in ms) / len(ms)))
PY
}

# jgroups_metric SHAPE FILE: the same figure from the driver's RESULT lines.
jgroups_metric() {
  python3 - "$1" "$2" <<'PY'
import sys
shape, f = sys.argv[1], sys.argv[2]
res = [dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv) for l in open(f) if l.startswith("RESULT")]
if not res or any(r.get("ok") != "true" for r in res):
    print(0)
elif shape == "mc4x4":
    print(int(float(res[0]["total_msgs_per_sec"])))
elif shape == "mc2x1-join":
    print(max(int(float(r["member_msgs_per_sec"])) for r in res))
else:
    print(int(float(res[0]["mean_member_msgs_per_sec"])))
PY
}

run_strata() {
  local shape=$1 out=$2 f
  f=$(flags "$shape")
  if [ "$shape" = mc2x1-join ]; then
    local port addr
    port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    addr=$(python3 -c 'import random; print("239.%d.%d.%d" % (random.randint(1,250), random.randint(0,255), random.randint(1,254)))')
    export STRATA_MCAST_PORT=$port STRATA_MCAST_ADDR=$addr STRATA_BIND_PORT=$((20000 + RANDOM % 20000))
    export STRATA_INITIAL_HOSTS=127.0.0.1:$STRATA_BIND_PORT
    # shellcheck disable=SC2086
    "$bin" perf -join $f "${scfg[@]}" -json > "$out.0" &
    local p0=$!
    sleep 0.5
    # shellcheck disable=SC2086
    "$bin" perf -join $f "${scfg[@]}" -json > "$out.1"
    wait $p0
    unset STRATA_MCAST_PORT STRATA_MCAST_ADDR STRATA_BIND_PORT STRATA_INITIAL_HOSTS
    strata_metric "$shape" "$out.0" "$out.1"
  else
    # shellcheck disable=SC2086
    "$bin" perf $f "${scfg[@]}" -json > "$out"
    strata_metric "$shape" "$out"
  fi
}

run_jgroups() {
  local shape=$1 out=$2 f
  f=$(flags "$shape")
  if [ "$shape" = mc2x1-join ]; then
    # shellcheck disable=SC2086
    "$jg" -join $f "${jcfg[@]}" -window 0 > "$out" 2>&1 || true
  else
    # shellcheck disable=SC2086
    "$jg" $f "${jcfg[@]}" -window 0 > "$out" 2>&1 || true
  fi
  jgroups_metric "$shape" "$out"
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print int((a[NR/2] + a[NR/2+1]) / 2)}'; }

echo "# $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -sr); $runs interleaved runs per shape; msgs/s received"
printf '%-11s %12s %12s %7s   %s\n' shape strata "$label" ratio "strata runs | jgroups runs"
for shape in $shapes; do
  s=() j=()
  for i in $(seq 1 "$runs"); do
    s+=("$(run_strata "$shape" "$tmp/s-$shape-$i")")
    j+=("$(run_jgroups "$shape" "$tmp/j-$shape-$i")")
  done
  sm=$(printf '%s\n' "${s[@]}" | median)
  jm=$(printf '%s\n' "${j[@]}" | median)
  ratio=$(python3 -c "print('%.2f' % ($sm / $jm) if $jm else 'n/a')")
  printf '%-11s %12s %12s %7s   %s | %s\n' "$shape" "$sm" "$jm" "$ratio" "${s[*]}" "${j[*]}"
done

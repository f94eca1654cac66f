#!/usr/bin/env bash
# sidebyside.sh: `stackdemo perf` next to JGroups 5.5.6 and 2.12, interleaved,
# at steady state, on 127.0.0.1 only; prints per shape the median msgs/s of
# each, the ratios, and strata's retransmissions per run.
#
#   bench/sidebyside.sh                     # RUNS=5 rounds of every shape
#   RUNS=3 SHAPES="mc2x1 uc2" JGROUPS=5 bench/sidebyside.sh
#
# Steady state: every run is a warm-up round of the same length as the
# measured one (uncounted, -warmup on both sides: JGroups' JIT and strata's
# pools are warm), then the measured round, sized to last at least 5 s on
# this machine (SCALE=0.1 shortens both, for a check of the script only; the
# output then says so). A measured round under 5 s is flagged with "short".
#
# Shapes (1000-byte messages, no application window on either side: strata
# is paced by UFC/MFC, JGroups by its own UFC/MFC):
#   mc2x1       2 members in one process, 1 sender, multicast: mean per member
#   mc2x1-join  the same with one process (JVM) per member: the receiver
#               (JGroups 5 only)
#   mc4x4       4 members in one process, all sending, multicast: total
#   uc2         2 members in one process, unicast to each other: mean per member
#
# JGROUPS="5 2.12" (the default) runs JGroups 5.5.6 from
# ../shared/bench/jgroups5/run.sh (JGROUPS5_RUN to override; used from
# there, never copied here) and Debian's JGroups 2.12 (libjgroups-java)
# through bench/jgroups212; one that is not installed is left out, with a
# WARNING line in the output (before, its runs printed 0). STACK=tcp
# runs configs/tcp.toml against JGroups 5's stock tcp.xml instead of
# configs/udp.toml against udp.xml (JGroups 5 only).
#
# Only a quiet machine gives figures worth keeping: JGroups slows down under
# load more than strata does, so loaded figures flatter strata. The script
# refuses to start when the 1-minute load average is above 0.5 (LOAD_OK=1
# runs anyway, and the output says so), and records the load at start and
# end and the git revision. The load average does not see a shared host:
# on a virtual machine whose host gives the cores to other guests, the
# share of CPU time it takes (steal, /proc/stat) is read for 5 s before the
# start while a busy loop runs on every core (an idle guest is never
# stolen from), and above 3% the script refuses too (STEAL_OK=1 runs
# anyway); each run's steal share is printed with it. Needs go, java, javac and python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jg5=${JGROUPS5_RUN:-$root/../shared/bench/jgroups5/run.sh}
jg212=$root/bench/jgroups212/run.sh
impls=${JGROUPS:-5 2.12}
scfg=() jcfg=() stack=udp
if [ "${STACK:-udp}" = tcp ]; then
  scfg=(-config "$root/configs/tcp.toml") jcfg=(-config tcp.xml) stack=tcp impls=5
fi
scale=${SCALE:-1}
# Both JGroups drivers run with a 1 GB heap (-Xms1g -Xmx1g). strata gets
# the same memory budget, GOMEMLIMIT=1GiB, paced by GOGC=400 inside it (a
# collection each time the heap grows fivefold; STRATA_GOGC sets another,
# off collects only near the limit). The budget is the same, not the
# collector. GOGC=200 was the setting in sessions 26-29: once the senders'
# payloads came from a slab (session 29), 400 was 4-11% faster in every
# shape (medians of 3 interleaved runs, session 30), for 320-346 MB
# resident in mc2x1 instead of 275-297 MB.
# GOGC=off was the setting until session 26: near the limit the runtime's
# scavenger hands freed pages back to the kernel to stay under 95% of it,
# and the next allocations fault them in again. mc2x1 took 335 K page
# faults a run with it and 84 K with GOGC=200 (1.43 instead of 1.62-1.68
# us of CPU per message, resident 300 MB instead of 1.08 GB). This is a
# tuned setting: STRATA_HEAP=SIZE sets another limit, and STRATA_HEAP=go
# runs with Go's default pacing (GOGC=100, a collection each time the heap
# doubles, GOGC and GOMEMLIMIT from the environment dropped), which is what
# an embedder gets without tuning.
heap=${STRATA_HEAP:-1GiB}
# The senders' payloads and messages: STRATA_ALLOC=slab (the default)
# carves them from a stack.Slab, 64 KB of payloads and 64 messages an
# allocation; STRATA_ALLOC=each makes each one on its own, as the JGroups
# drivers do (new byte[] and a new message per message). A JVM allocates
# those for a few nanoseconds; Go's make of 1000 bytes cost strata's
# mc2x1-join sender about 0.3 us of its 1.9 us per message (session 29), so
# each language's driver makes them the way that language's senders would.
alloc=${STRATA_ALLOC:-slab}
gogc=${STRATA_GOGC:-400}
if [ "$heap" = go ]; then
  genv=(env -u GOGC -u GOMEMLIMIT) heapdesc="Go's default GC pacing (GOGC=100), untuned"
else
  genv=(env "GOGC=$gogc" "GOMEMLIMIT=$heap") heapdesc="GOGC=$gogc GOMEMLIMIT=$heap, tuned"
  if [ "$heap" = 1GiB ]; then heapdesc="$heapdesc to the JVMs' -Xms1g -Xmx1g"; fi
fi
load() { cut -d' ' -f1 /proc/loadavg; }
load0=$(load)
if python3 -c "import sys; sys.exit(0 if $load0 > 0.5 else 1)"; then
  if [ "${LOAD_OK:-}" != 1 ]; then
    echo "sidebyside.sh: load average $load0 is above 0.5: figures would flatter strata; wait for a quiet machine (LOAD_OK=1 to run anyway)" >&2
    exit 2
  fi
  echo "# WARNING: started at load $load0 (above 0.5, LOAD_OK=1): these figures are not quiet-machine figures"
fi
# snap: the machine's CPU counters, "busy idle steal" in ticks (the first
# line of /proc/stat, added in bash: awk would print large counts as
# 3e+09); steal_share A B: the share of steal between two snaps, a
# fraction; pct: a fraction as a percentage.
snap() {
  local _ u n s i w q sq st
  read -r _ u n s i w q sq st _ < /proc/stat
  echo "$((u + n + s + q + sq)) $((i + w)) $st"
}
steal_share() { python3 -c "import sys; a, b = [list(map(int, x.split())) for x in sys.argv[1:3]]; d = [y - x for x, y in zip(a, b)]; print(d[2] / max(1, sum(d)))" "$1" "$2"; }
pct() { python3 -c "import sys; print('%.0f%%' % (100 * float(sys.argv[1])))" "$1"; }
steal_pct() { pct "$(steal_share "$1" "$2")"; }
before=$(snap)
for _ in $(seq "$(nproc --all)"); do python3 -c 'import time; t = time.time() + 5
while time.time() < t: pass' & done
wait
share0=$(steal_share "$before" "$(snap)")
steal0=$(pct "$share0")
if python3 -c "import sys; sys.exit(0 if $share0 > 0.03 else 1)"; then
  if [ "${STEAL_OK:-}" != 1 ]; then
    echo "sidebyside.sh: the host took $steal0 of this machine's CPU time in 5 s of busy loops: other guests share the cores, figures would not be a quiet machine's (STEAL_OK=1 to run anyway)" >&2
    exit 2
  fi
  echo "# WARNING: the host took $steal0 of the CPU time before the start (above 3%, STEAL_OK=1): these figures are not quiet-machine figures"
fi
# A JGroups that is not installed would print 0 in every run: leave it out,
# and say so where the figures are.
missing=()
have=()
for impl in $impls; do
  case $impl in
    2.12) [ -f "${JGROUPS212_JAR:-/usr/share/java/jgroups.jar}" ] && have+=("$impl") || missing+=("JGroups 2.12 (apt-get install libjgroups-java)") ;;
    5) [ -x "$jg5" ] && have+=("$impl") || missing+=("JGroups 5.5.6 ($jg5 not found)") ;;
    *) echo "sidebyside.sh: JGROUPS: unknown version $impl (5 or 2.12)" >&2; exit 2 ;;
  esac
done
impls=${have[*]-}
runs=${RUNS:-5}
shapes=${SHAPES:-mc2x1 mc2x1-join mc4x4 uc2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/stackdemo
(cd "$root" && go build -o "$bin" ./cmd/stackdemo)

# count SHAPE: messages per sender of the measured round, sized for at
# least 5 s at today's rates on this machine (scaled by SCALE).
count() {
  local n
  case $1 in
    mc2x1) n=9000000 ;;
    mc2x1-join) n=7000000 ;;
    mc4x4) n=1500000 ;;
    uc2) n=5000000 ;;
  esac
  python3 -c "print(max(1000, int($n * $scale)))"
}

flags() {
  local c
  c=$(count "$1")
  case $1 in
    mc2x1 | mc2x1-join) echo "-members 2 -senders 1 -count $c -warmup $c -size 1000" ;;
    mc4x4) echo "-members 4 -count $c -warmup $c -size 1000" ;;
    uc2) echo "-members 2 -mode unicast -count $c -warmup $c -size 1000" ;;
  esac
}

# strata_flags SHAPE: the flags both sides get, and strata's -alloc.
strata_flags() {
  echo "$(flags "$1") -alloc $alloc"
}

# strata_metric SHAPE FILE...: "figure seconds retransmissions gc" from
# perf's JSON output (retransmissions: NAKACK's and UNICAST2's, every
# member; gc: the collector's share of the busy CPU, the largest of the
# processes').
strata_metric() {
  local shape=$1; shift
  python3 - "$shape" "$@" <<'PY'
import json, sys
shape, files = sys.argv[1], sys.argv[2:]
rs = []
for f in files:
    try:
        rs.append(json.load(open(f)))
    except (OSError, ValueError):
        print("0 0 0 -"); sys.exit()
if any(r.get("errors") for r in rs):
    fig = 0
elif shape == "mc4x4":
    fig = int(rs[0]["total_msgs_per_sec"])
elif shape == "mc2x1-join":
    fig = int(max(m["msgs_per_sec"] for r in rs for m in r["per_member"]))
else:
    ms = rs[0]["per_member"]
    fig = int(sum(m["msgs_per_sec"] for m in ms) / len(ms))
secs = min(r["seconds"] for r in rs)
xmits = sum(v for r in rs for k, v in r.get("stats", {}).items() if k.endswith(".retransmissions"))
gc = max(r.get("gc", {}).get("cpu_share", 0) for r in rs)
print(fig, "%.1f" % secs, xmits, "%.0f%%" % (100 * gc))
PY
}

# jgroups_metric SHAPE FILE: "figure seconds" from the driver's RESULT lines.
jgroups_metric() {
  python3 - "$1" "$2" <<'PY'
import sys
shape, f = sys.argv[1], sys.argv[2]
res = [dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv) for l in open(f) if l.startswith("RESULT")]
if not res or any(r.get("ok") != "true" for r in res):
    print(0, 0); sys.exit()
secs = min(float(r.get("seconds", 0)) for r in res)
if shape == "mc4x4":
    fig = int(float(res[0]["total_msgs_per_sec"]))
elif shape == "mc2x1-join":
    fig = max(int(float(r["member_msgs_per_sec"])) for r in res)
else:
    fig = int(float(res[0]["mean_member_msgs_per_sec"]))
print(fig, "%.1f" % secs)
PY
}

run_strata() {
  local shape=$1 out=$2 f
  f=$(strata_flags "$shape")
  if [ "$shape" = mc2x1-join ]; then
    local port addr
    port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    addr=$(python3 -c 'import random; print("239.%d.%d.%d" % (random.randint(1,250), random.randint(0,255), random.randint(1,254)))')
    export STRATA_MCAST_PORT=$port STRATA_MCAST_ADDR=$addr STRATA_BIND_PORT=$((20000 + RANDOM % 20000))
    export STRATA_INITIAL_HOSTS=127.0.0.1:$STRATA_BIND_PORT
    # shellcheck disable=SC2086
    "${genv[@]}" "$bin" perf -join $f "${scfg[@]}" -json > "$out.0" 2> "$out.err0" &
    local p0=$!
    sleep 0.5
    # shellcheck disable=SC2086
    "${genv[@]}" "$bin" perf -join $f "${scfg[@]}" -json > "$out.1" 2> "$out.err1" || true
    wait $p0 || true
    unset STRATA_MCAST_PORT STRATA_MCAST_ADDR STRATA_BIND_PORT STRATA_INITIAL_HOSTS
    strata_metric "$shape" "$out.0" "$out.1"
  else
    # shellcheck disable=SC2086
    "${genv[@]}" "$bin" perf $f "${scfg[@]}" -json > "$out" 2> "$out.err" || true
    strata_metric "$shape" "$out"
  fi
}

# run_jgroups IMPL SHAPE OUT: IMPL is 5 or 2.12.
run_jgroups() {
  local impl=$1 shape=$2 out=$3 f
  f=$(flags "$shape")
  if [ "$impl" = 2.12 ]; then
    if [ "$shape" = mc2x1-join ]; then echo "- -"; return; fi
    # shellcheck disable=SC2086
    "$jg212" $f -window 0 > "$out" 2>&1 || true
  elif [ "$shape" = mc2x1-join ]; then
    # shellcheck disable=SC2086
    "$jg5" -join $f "${jcfg[@]}" -window 0 > "$out" 2>&1 || true
  else
    # shellcheck disable=SC2086
    "$jg5" $f "${jcfg[@]}" -window 0 > "$out" 2>&1 || true
  fi
  jgroups_metric "$shape" "$out"
}

median() { { grep -v '^-$' || true; } | sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR+1)/2]; else print int((a[NR/2] + a[NR/2+1]) / 2)}'; }
ratio() { python3 -c "import sys; s, j = sys.argv[1], sys.argv[2]; print('%.2f' % (int(s) / int(j)) if j not in ('-', '0') else 'n/a')" "$1" "$2"; }

rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then rev="$rev+dirty"; fi
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, strata $rev, stack $stack, on $(nproc) cores, $(uname -sr); load at start $load0, steal $steal0 in 5 s of busy loops before"
echo "# strata's heap: $heapdesc; its senders' payloads and messages: -alloc $alloc"
for m in "${missing[@]}"; do echo "# WARNING: not installed, left out: $m"; done
echo "# $runs interleaved runs per shape; each run: a warm-up round, then the measured round (counts x$scale); msgs/s received"
[ "$scale" = 1 ] || echo "# SCALE=$scale: shortened runs, for a check of the script only: not steady-state figures"
printf '%-11s %10s' shape strata
for impl in $impls; do printf ' %10s %6s' "jg$impl" ratio; done
printf '   %s\n' "strata runs (s, retransmissions, gc share, steal) | jgroups runs (s, steal) ..."
for shape in $shapes; do
  s=() sd=()
  declare -A j=() jd=()
  for i in $(seq 1 "$runs"); do
    a=$(snap)
    read -r fig secs xm gc < <(run_strata "$shape" "$tmp/s-$shape-$i")
    st=$(steal_pct "$a" "$(snap)")
    s+=("$fig")
    short=; python3 -c "import sys; sys.exit(0 if float('$secs') < 5 else 1)" && short=" short"
    sd+=("$fig (${secs}s, $xm, gc $gc, $st$short)")
    for impl in $impls; do
      a=$(snap)
      read -r fig secs < <(run_jgroups "$impl" "$shape" "$tmp/j$impl-$shape-$i")
      st=$(steal_pct "$a" "$(snap)")
      j[$impl]+="$fig "
      if [ "$fig" = - ]; then jd[$impl]+="-, "; continue; fi
      short=; python3 -c "import sys; sys.exit(0 if float('$secs') < 5 else 1)" && short=" short"
      jd[$impl]+="$fig (${secs}s, $st$short), "
    done
  done
  sm=$(printf '%s\n' "${s[@]}" | median)
  printf '%-11s %10s' "$shape" "$sm"
  detail="${sd[*]}"
  for impl in $impls; do
    # shellcheck disable=SC2086
    jm=$(printf '%s\n' ${j[$impl]} | median)
    printf ' %10s %6s' "$jm" "$(ratio "$sm" "$jm")"
    detail="$detail | ${jd[$impl]%, }"
  done
  printf '   %s\n' "$detail"
  unset j jd
done
echo "# load at end $(load)"

#!/bin/bash
# Memory of the agent against the NVML floor on a real GPU, mapping by mapping: nvml_min (the
# floor), the agent, and the agent with MALLOC_ARENA_MAX=1, run side by side for 60 s with a few
# scrapes; prints VmRSS/RssAnon/RssFile and the largest mappings of each, keeps their smaps in
# $OUT/mem. Read-only: it only loads NVML and reads. Needs gcc, curl and gpu-steward beside it.
# usage: OUT=/tmp/out bash mem-probe.sh
#        OUT=/tmp/out B_BIN=/path/to/other/gpu-steward bash mem-probe.sh   (B: another build,
#        e.g. one built with other RUSTFLAGS, instead of MALLOC_ARENA_MAX=1)
#        OUT=/tmp/out B_ENV=MALLOC_ARENA_MAX=2 bash mem-probe.sh   (B: other environment)
set -u
D=$(cd "$(dirname "$0")" && pwd)
R=${OUT:-/tmp}/mem; mkdir -p $R
NVLIB=$(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}')
gcc -O2 -o $R/nvml_min $D/nvml_min.c -ldl
$R/nvml_min 70 > $R/nvml_min.out 2>&1 & M=$!
$D/gpu-steward run --listen 127.0.0.1:9410 --interval 1s --nvml-lib "$NVLIB" > $R/agent-a.log 2>&1 & A=$!
B_BIN=${B_BIN:-$D/gpu-steward}
[ -z "${B_ENV+set}" ] && [ "$B_BIN" = "$D/gpu-steward" ] && B_ENV=MALLOC_ARENA_MAX=1
env ${B_ENV:-} "$B_BIN" run --listen 127.0.0.1:9411 --interval 1s --nvml-lib "$NVLIB" > $R/agent-b.log 2>&1 & B=$!
sleep 20
for i in 1 2 3 4 5; do curl -s -o /dev/null 127.0.0.1:9410/metrics; curl -s -o /dev/null 127.0.0.1:9411/metrics; curl -s -o /dev/null -H 'Accept-Encoding: gzip' 127.0.0.1:9410/metrics; curl -s -o /dev/null -H 'Accept-Encoding: gzip' 127.0.0.1:9411/metrics; done
sleep 40
for p in M A B; do pid=${!p}; readlink /proc/$pid/exe > $R/exe-$p.txt; cp /proc/$pid/smaps $R/smaps-$p.txt; cp /proc/$pid/smaps_rollup $R/rollup-$p.txt; cp /proc/$pid/status $R/status-$p.txt; ls /proc/$pid/task | wc -l > $R/threads-$p.txt; done
kill $A $B; wait $M; cat $R/nvml_min.out
echo "== $(ldd --version 2>&1 | head -1); B: ${B_ENV:-} $B_BIN"
for p in M A B; do echo "== $p threads $(cat $R/threads-$p.txt)"; grep -E 'VmRSS|RssAnon|RssFile|RssShmem|VmHWM' $R/status-$p.txt; done
for p in M A B; do echo "== $p top mappings by Rss"; awk '/^[0-9a-f]+-[0-9a-f]+ /{name=$6; if(name=="")name="[anon]"} /^Rss:/{rss[name]+=$2} END{for(n in rss) if(rss[n]>100) printf "%8d kB %s\n", rss[n], n}' $R/smaps-$p.txt | sort -rn | head -12; done
# The executable's own mappings (its code, read-only data and relocated data).
for p in A B; do
  echo "== $p executable $(cat $R/exe-$p.txt), by mapping"
  awk -v exe="$(cat $R/exe-$p.txt)" '/^[0-9a-f]+-[0-9a-f]+ /{ours=($6==exe); perm=$2}
    ours && /^Rss:/{print "   " perm, $2, "kB"; t+=$2} END{print "   " t " kB mapped"}' $R/smaps-$p.txt
done

#!/usr/bin/env bash
# Builds the .deb and proves the dpkg path works on the first try: contents, lintian (no errors),
# install, the installed check-config and demo (as the unprivileged gpu-steward user), upgrade
# over itself, purge, and nothing left behind. Run as root on a throwaway Debian machine (CI):
# it installs and purges the package for real. Idempotent; cleans up on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TERM_COLOR=never DEBIAN_FRONTEND=noninteractive

say() { echo "--- deb: $*"; }
fail() { echo "deb: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root (it installs and purges the package)"

# A marker says that an installed gpu-steward came from an interrupted run of this script; any
# other installed gpu-steward is someone's real install, which this test must not purge.
MARKER=/var/tmp/gpu-steward-deb-test.marker
if dpkg -s gpu-steward >/dev/null 2>&1; then
  [ -f "$MARKER" ] || fail "gpu-steward is installed and not by this test; refusing to purge it"
  say "purging the leftover of an interrupted run"
  dpkg --purge gpu-steward >/dev/null
fi

TMP=$(mktemp -d)
DEMO_PID=""
cleanup() {
  set +e
  [ -n "$DEMO_PID" ] && kill "$DEMO_PID" 2>/dev/null && wait "$DEMO_PID" 2>/dev/null
  if dpkg -s gpu-steward >/dev/null 2>&1; then dpkg --purge gpu-steward >/dev/null 2>&1; fi
  rm -f "$MARKER"
  rm -rf "$TMP"
}
trap cleanup EXIT

missing=""
command -v lintian >/dev/null || missing="$missing lintian"
command -v dpkg-shlibdeps >/dev/null || missing="$missing dpkg-dev"   # cargo-deb's $auto depends
command -v curl >/dev/null || missing="$missing curl"
command -v systemd-analyze >/dev/null || missing="$missing systemd"
# The package depends on adduser (its postinst creates the user) and dpkg -i resolves nothing.
command -v adduser >/dev/null || missing="$missing adduser"
if [ -n "$missing" ]; then
  say "apt-get install$missing"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if ! cargo deb --version >/dev/null 2>&1; then
  say "cargo install cargo-deb --locked (once per machine)"
  cargo install cargo-deb --locked --quiet
fi

say "cargo build --release --workspace (the agent and libnvml_sim.so)"
# Packed relocations need glibc 2.36; the .deb stays loadable on 2.35 (checked below).
env -u RUSTFLAGS cargo build --release --workspace --quiet
say "the packaged config names every key the agent accepts, and only those"
python3 packaging/deb/check_config_keys.py target/release/gpu-steward packaging/deb/config.toml
say "cargo deb"
cargo deb --no-build --output "$TMP/" >/dev/null
DEB=$(ls "$TMP"/gpu-steward_*.deb)
echo "$DEB"

say "contents (dpkg-deb -c)"
dpkg-deb -c "$DEB" | awk '{print $1, $6}' | tee "$TMP/contents"
for path in ./usr/bin/gpu-steward ./usr/lib/gpu-steward/libnvml_sim.so \
  ./lib/systemd/system/gpu-steward.service ./etc/gpu-steward/config.toml \
  ./usr/share/doc/gpu-steward/install.md ./usr/share/doc/gpu-steward/copyright \
  ./usr/share/doc/gpu-steward/sharing.md ./usr/share/doc/gpu-steward/configuration.md \
  ./usr/share/gpu-steward/alerts/gpu-steward.rules.yml \
  ./usr/share/gpu-steward/alerts/gpu-steward-nvlink.rules.yml \
  ./usr/share/gpu-steward/alerts/gpu-steward-operations.rules.yml \
  ./usr/share/gpu-steward/recording/gpu-steward-accounting.rules.yml \
  ./usr/share/gpu-steward/scenarios/dgx-h100.toml \
  ./usr/share/gpu-steward/scenarios/demo.toml \
  ./usr/share/gpu-steward/scenarios/faults.toml \
  ./usr/share/gpu-steward/systemd/mig.conf \
  ./usr/share/gpu-steward/systemd/compute-mode.conf \
  ./usr/share/gpu-steward/systemd/reclaim-signal.conf \
  ./usr/share/gpu-steward/systemd/run-as-root.conf \
  ./usr/share/gpu-steward/dashboards/gpu-steward-operations.json \
  ./usr/share/gpu-steward/dashboards/gpu-steward-node.json \
  ./usr/share/gpu-steward/dashboards/gpu-steward-nvlink.json \
  ./usr/share/gpu-steward/slurm/epilog; do
  grep -q " $path\$" "$TMP/contents" || fail "$path is not in the package"
done
# slurmd runs the epilog as it is installed (slurm.conf Epilog=): it must be executable.
grep -qx -- '-rwxr-xr-x ./usr/share/gpu-steward/slurm/epilog' "$TMP/contents" \
  || fail "the Slurm epilog is not installed executable (0755)"
# The shipped executable has no packed relocations (which would refuse to load on glibc < 2.36,
# e.g. Ubuntu 22.04).
dpkg-deb -x "$DEB" "$TMP/root"
readelf -V "$TMP/root/usr/bin/gpu-steward" > "$TMP/versions"
if grep -q GLIBC_ABI_DT_RELR "$TMP/versions"; then
  fail "the packaged gpu-steward needs GLIBC_ABI_DT_RELR (glibc 2.36): build the .deb without -z pack-relative-relocs in RUSTFLAGS"
fi
# (Listed into files first: `grep -q` closing a pipe early would fail the pipeline.)
dpkg-deb -e "$DEB" "$TMP/control"
grep -qx /etc/gpu-steward/config.toml "$TMP/control/conffiles" \
  || fail "/etc/gpu-steward/config.toml is not a conffile"
for script in postinst prerm postrm; do
  [ -x "$TMP/control/$script" ] || fail "no executable $script in the package"
done
grep '^Depends:' "$TMP/control/control"

say "lintian (errors fail, warnings are reported)"
lintian --fail-on error "$DEB" \
  | tee "$TMP/lintian" || fail "lintian found errors"
echo "lintian: $(grep -c '^E:' "$TMP/lintian" || true) errors, $(grep -c '^W:' "$TMP/lintian" || true) warnings"

say "dpkg -i"
touch "$MARKER"
dpkg -i "$DEB"
getent passwd gpu-steward >/dev/null || fail "postinst did not create the gpu-steward user"
[ -L /etc/systemd/system/multi-user.target.wants/gpu-steward.service ] || fail "unit not enabled"
out=$(systemd-analyze verify /lib/systemd/system/gpu-steward.service 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify is not clean: $out"
systemd-analyze security --offline=true /lib/systemd/system/gpu-steward.service 2>/dev/null | tail -1
say "each shipped drop-in, installed as docs/install.md says, keeps the unit clean"
mkdir -p /etc/systemd/system/gpu-steward.service.d
for d in /usr/share/gpu-steward/systemd/*.conf; do
  cp "$d" /etc/systemd/system/gpu-steward.service.d/
  out=$(systemd-analyze verify /lib/systemd/system/gpu-steward.service 2>&1) || fail "systemd-analyze verify with $d: $out"
  [ -z "$out" ] || fail "systemd-analyze verify with $d is not clean: $out"
  rm "/etc/systemd/system/gpu-steward.service.d/$(basename "$d")"
done
rmdir /etc/systemd/system/gpu-steward.service.d

say "installed gpu-steward check-config /etc/gpu-steward/config.toml"
/usr/bin/gpu-steward check-config /etc/gpu-steward/config.toml
say "every page the packaged config points to is installed"
for page in $(grep -o '/usr/share/doc/gpu-steward/[a-z-]*\.md' /etc/gpu-steward/config.toml | sort -u); do
  [ -f "$page" ] || fail "/etc/gpu-steward/config.toml points to $page, which is not installed"
done
say "the shipped alert files load in the agent's own evaluator"
printf '[rules]\nfiles = ["/usr/share/gpu-steward/alerts/*.rules.yml"]\n' > "$TMP/rules.toml"
/usr/bin/gpu-steward check-config "$TMP/rules.toml"

say "installed gpu-steward demo, as the gpu-steward user, on a free loopback port"
# setpriv execs the agent itself (no intermediate process), so $! is the agent and SIGTERM
# reaches it; a leftover process of the user would also keep postrm from deleting the user.
(cd / && exec setpriv --reuid=gpu-steward --regid=gpu-steward --init-groups \
  /usr/bin/gpu-steward demo --listen 127.0.0.1:0 2>"$TMP/demo.log") &
DEMO_PID=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/demo.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$DEMO_PID" 2>/dev/null || { cat "$TMP/demo.log"; fail "the demo exited"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$TMP/demo.log"; fail "the demo did not log its address"; }
ready=""
for _ in $(seq 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz" || true)
  [ "$code" = 200 ] && { ready=1; break; }
  sleep 0.1
done
[ -n "$ready" ] || { cat "$TMP/demo.log"; fail "/readyz never answered 200"; }
curl -sf "http://127.0.0.1:$port/metrics" >"$TMP/metrics"
gpus=$(grep -c '^gpu_steward_gpu_up{.*} 1$' "$TMP/metrics" || true)
dcgm=$(grep -c '^DCGM_FI_DEV_GPU_UTIL{' "$TMP/metrics" || true)
echo "/readyz 200 on port $port; /metrics: $gpus GPUs up, $dcgm DCGM_FI_DEV_GPU_UTIL series"
[ "$gpus" -eq 8 ] && [ "$dcgm" -eq 8 ] || fail "expected 8 simulated GPUs"
kill "$DEMO_PID"; wait "$DEMO_PID" || fail "the demo did not exit 0 on SIGTERM"
DEMO_PID=""

say "dpkg -i again (upgrade path over the same version)"
dpkg -i "$DEB" >/dev/null

say "dpkg --purge, then nothing may be left"
contents=$(dpkg -L gpu-steward | sort -r)
dpkg --purge gpu-steward
left=""
for f in $contents; do
  # Shared directories (/usr/bin, /etc, ...) stay; anything that is ours must be gone.
  case "$f" in */gpu-steward*|*/gpu-steward.service) [ -e "$f" ] && left="$left $f" ;; esac
done
for f in /etc/gpu-steward /usr/lib/gpu-steward /usr/share/gpu-steward /usr/share/doc/gpu-steward \
  /var/lib/gpu-steward \
  /etc/systemd/system/multi-user.target.wants/gpu-steward.service \
  /var/lib/systemd/deb-systemd-helper-enabled/gpu-steward.service.dsh-also \
  /var/lib/systemd/deb-systemd-helper-masked/gpu-steward.service; do
  [ -e "$f" ] && left="$left $f"
done
getent passwd gpu-steward >/dev/null && left="$left user:gpu-steward"
getent group gpu-steward >/dev/null && left="$left group:gpu-steward"
[ -z "$left" ] || fail "left behind after purge:$left"
echo "deb: OK"

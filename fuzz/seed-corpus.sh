#!/usr/bin/env bash
# Seeds fuzz/corpus/ from what the repository ships (configs, scenarios, rules, requests) and
# from the inputs that once found a bug (fuzz/regressions/<target>/), so that a run starts from
# real inputs and re-checks every old finding. The corpora are not committed (a run rewrites
# thousands of files; fuzz/.gitignore has them); a new finding goes into regressions/.
# Usage: bash fuzz/seed-corpus.sh, then e.g. `cargo +nightly fuzz run -O config`.
set -euo pipefail
cd "$(dirname "$0")"
root=..
seed() { mkdir -p "corpus/$1"; cp "$2" "corpus/$1/seed-$(basename "$2")"; }

for f in "$root"/packaging/deb/config.toml "$root"/packaging/kubernetes/base/*.toml; do
  [ -f "$f" ] && seed config "$f"
done
for f in "$root"/tests/scenarios/*.toml "$root"/nvml-sim/scenarios/*.toml; do
  [ -f "$f" ] && seed scenario "$f"
done
# rules: RULES \0 EXPOSITION, the shipped construct tests over a small page.
mkdir -p corpus/rules
for f in "$root"/src/rules/testdata/*.rules.yml "$root"/alerts/*.yml; do
  [ -f "$f" ] || continue
  { cat "$f"; printf '\0'; printf 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0"} 61\ngpu_steward_gpu_up{gpu="0",uuid="GPU-0"} 1\n'; } \
    > "corpus/rules/seed-$(basename "$f")"
done
mkdir -p corpus/web_config corpus/http corpus/alertmanager
printf 'tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\nbasic_auth_users:\n  prom: $2y$10$abc\n' \
  > corpus/web_config/seed-tls-basic.yml
printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n' > corpus/http/seed-scrape
printf 'GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n' > corpus/http/seed-keepalive
printf 'POST /api/v1/alertmanager HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}' > corpus/http/seed-post
printf '{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"GpuXid","gpu":"0"},"startsAt":"2026-01-01T00:00:00Z","fingerprint":"abc"}]}' \
  > corpus/alertmanager/seed-firing.json
# Every input that once found a bug, under its own name.
for d in regressions/*/; do
  target=$(basename "$d")
  mkdir -p "corpus/$target"
  for f in "$d"*; do
    [ -f "$f" ] && cp "$f" "corpus/$target/regression-$(basename "$f")"
  done
done
echo "seeded: $(find corpus -type f | wc -l) files under fuzz/corpus"

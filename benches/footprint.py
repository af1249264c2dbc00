#!/usr/bin/env python3
"""Measures gpu-steward's footprint on the simulated 8xH100 node and prints a markdown table.

- time from process start to the first `/readyz` 200;
- resident memory (VmRSS, VmHWM) after a minute of polling at the default 5 s interval, and how
  much of it is the executable's own mappings;
- NVML calls per poll, per function (from the simulator's NVML_SIM_STATS call counts);
- SIGTERM to exit with an idle keep-alive connection open;
- /metrics latency over loopback (plain and gzip), median and p99 of N sequential scrapes.

Usage: cargo build --release --workspace && python3 benches/footprint.py [--seconds 60]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary_rss(pid):
    """kB of the process's RSS that maps its own executable (smaps entries named after it)."""
    exe = os.readlink(f"/proc/{pid}/exe")
    total, ours = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                ours = len(fields) >= 6 and fields[5] == exe
            elif ours and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def get(port, path, headers=""):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            break
        chunks.append(b)
    s.close()
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def metric(body, name):
    m = re.search(rb"^" + name.encode() + rb"(?:\{[^}]*\})? (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--profile", default="release")
    args = ap.parse_args()
    exe = os.path.join(ROOT, "target", args.profile, "gpu-steward")
    tmp = tempfile.mkdtemp()
    stats = os.path.join(tmp, "stats.json")
    env = dict(os.environ, NVML_SIM_STATS=stats, RUST_LOG="info")
    start = time.monotonic()
    p = subprocess.Popen([exe, "demo", "--listen", "127.0.0.1:0"], env=env,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    while True:
        try:
            if get(port, "/readyz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.002)
    ready_ms = (time.monotonic() - start) * 1000

    # Calls per poll: difference of two stats files divided by the polls in between.
    time.sleep(6)
    polls_a = metric(get(port, "/metrics")[1], "gpu_steward_polls_total")
    time.sleep(1.2)  # the simulator rewrites its stats at most once a second
    with open(stats) as f:
        calls_a = json.load(f)
    time.sleep(max(args.seconds - 7, 11))
    polls_b = metric(get(port, "/metrics")[1], "gpu_steward_polls_total")
    time.sleep(1.2)
    with open(stats) as f:
        calls_b = json.load(f)
    polls = polls_b - polls_a

    status = open(f"/proc/{p.pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    own = binary_rss(p.pid) / 1024

    lat = {}
    for label, hdr in (("plain", ""), ("gzip", "Accept-Encoding: gzip\r\n")):
        xs = []
        size = 0
        for _ in range(args.scrapes):
            t = time.perf_counter()
            _, body = get(port, "/metrics", hdr)
            xs.append((time.perf_counter() - t) * 1000)
            size = len(body)
        xs.sort()
        lat[label] = (statistics.median(xs), xs[int(len(xs) * 0.99) - 1], size)

    # Shutdown with an idle keep-alive connection open, as Prometheus holds one.
    idle = socket.create_connection(("127.0.0.1", port))
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=10)
    stop_ms = (time.monotonic() - t) * 1000
    idle.close()

    per_fn = {k: (calls_b.get(k, 0) - calls_a.get(k, 0)) / polls for k in calls_b}
    per_fn = {k: v for k, v in per_fn.items() if v > 0}
    total = sum(per_fn.values())
    print(f"| measure | value |\n|---|---|")
    print(f"| start to first `/readyz` 200 | {ready_ms:.0f} ms |")
    print(f"| resident memory after {args.seconds} s (VmRSS / VmHWM) | {rss:.1f} MiB / {hwm:.1f} MiB |")
    print(f"| of which the executable's own mappings (code, read-only data, relocated data) | "
          f"{own:.1f} MiB |")
    print(f"| NVML calls per poll (8 GPUs) | {total:.0f} |")
    print(f"| SIGTERM to exit (exit code {code}), with an idle connection open | {stop_ms:.0f} ms |")
    for label, (med, p99, size) in lat.items():
        print(f"| `/metrics` {label}: median / p99 over {args.scrapes} scrapes, body size | "
              f"{med:.2f} ms / {p99:.2f} ms, {size} bytes |")
    print("\n| NVML function | calls per poll |\n|---|---|")
    for k, v in sorted(per_fn.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"| `{k}` | {v:g} |")


if __name__ == "__main__":
    sys.exit(main())

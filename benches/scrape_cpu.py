#!/usr/bin/env python3
"""CPU the agent spends per /metrics scrape of the 8xH100 demo page, for one or more builds
side by side in one run (so that they share the machine's state).

Two ways of scraping, each against a fresh agent (demo node, NVML cost model on):

- `prometheus`: one gzip scrape per publication, as a Prometheus scraping every 15-30 s sees a
  poll's page (the agent polls every 1 s here; each scrape reads a page nobody has compressed):
  the agent's CPU per scrape, above what the same agent spends polling alone over as long;
- `burst`: wrk hammering gzip scrapes for a few seconds (thousands of scrapes per publication):
  the serving path alone, compression amortised.

CPU is the time on CPU of every thread (/proc/PID/task/*/schedstat, nanoseconds), sampled
around each window.

Usage: cargo build --release --workspace && python3 benches/scrape_cpu.py
       [--bin target/release/gpu-steward --bin /other/build/gpu-steward] [--seconds 20]
Needs wrk (Debian: wrk) for the burst; without it only `prometheus` runs.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cost_table():
    for rel in ("nvml-sim/costs/h100-driver-580.json",):
        p = os.path.join(ROOT, rel)
        if os.path.exists(p):
            return p
    raise SystemExit("no NVML cost table found under nvml-sim/costs")


def cpu_seconds(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that ended between the listing and the read
    return total / 1e9


def get(port, gz):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    extra = "Accept-Encoding: gzip\r\n" if gz else ""
    s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
    n = 0
    while True:
        b = s.recv(262144)
        if not b:
            break
        n += len(b)
    s.close()
    return n


def start(binary, interval):
    sim = os.path.join(os.path.dirname(binary), "libnvml_sim.so")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(os.environ, RUST_LOG="warn", NVML_SIM_COST=cost_table())
    agent = subprocess.Popen([binary, "demo", "--listen", f"127.0.0.1:{port}", "--nvml-lib", sim,
                              "--interval", interval], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if get(port, False) > 0:
                time.sleep(3)  # past start-up work
                return agent, port
        except OSError:
            time.sleep(0.2)
    agent.kill()
    raise SystemExit(f"{binary} did not serve within 30 s")


def prometheus_rate(binary, seconds):
    """CPU per gzip scrape at one scrape per publication, above polling alone."""
    agent, port = start(binary, "1s")
    try:
        c0 = cpu_seconds(agent.pid)
        time.sleep(seconds)
        idle = cpu_seconds(agent.pid) - c0
        c1 = cpu_seconds(agent.pid)
        scrapes, size = 0, 0
        end = time.time() + seconds
        while time.time() < end:
            # Half-way between two polls: the page is fresh and nobody has compressed it.
            time.sleep(1.0 - (time.time() % 1.0) + 0.5)
            size = get(port, True)
            scrapes += 1
        busy = cpu_seconds(agent.pid) - c1
    finally:
        agent.terminate()
        agent.wait(10)
    return {"scrapes": scrapes, "gzip_bytes": size,
            "cpu_us_per_scrape": (busy - idle) / max(scrapes, 1) * 1e6,
            "poll_cpu_pct": idle / seconds * 100}


def burst(binary, seconds):
    if not shutil.which("wrk"):
        return None
    agent, port = start(binary, "1s")
    try:
        c0 = cpu_seconds(agent.pid)
        out = subprocess.run(["wrk", "-t1", "-c4", f"-d{seconds}s", "-H", "Accept-Encoding: gzip",
                              f"http://127.0.0.1:{port}/metrics"],
                             capture_output=True, text=True, check=True).stdout
        busy = cpu_seconds(agent.pid) - c0
    finally:
        agent.terminate()
        agent.wait(10)
    requests = int(next(l for l in out.splitlines() if "requests in" in l).split()[0])
    return {"requests": requests, "req_per_s": requests / seconds,
            "cpu_us_per_scrape": busy / max(requests, 1) * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append",
                    help="gpu-steward executable with libnvml_sim.so beside it (repeatable)")
    ap.add_argument("--seconds", type=int, default=20)
    args = ap.parse_args()
    bins = args.bin or [os.path.join(ROOT, "target", "release", "gpu-steward")]
    print("| build | gzip page | Prometheus rate: CPU per scrape (scrapes) | burst (wrk -c4): CPU per scrape, req/s | polling alone, % of a core |")
    print("|---|---|---|---|---|")
    for b in bins:
        p = prometheus_rate(b, args.seconds)
        w = burst(b, min(args.seconds, 10))
        wtxt = f"{w['cpu_us_per_scrape']:.0f} µs, {w['req_per_s']:.0f}" if w else "— (no wrk)"
        print(f"| {b} | {p['gzip_bytes']:,} B | {p['cpu_us_per_scrape']:.0f} µs ({p['scrapes']}) "
              f"| {wtxt} | {p['poll_cpu_pct']:.2f} % |", flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A big node, for a long time: N GPUs (H100, MIG on, 7 instances each) and P processes, with a
tenth of the processes replaced every minute, polled every second with the real H100's NVML
costs (NVML_SIM_COST), scraped every second (plain and gzip, alternating) for the whole run.

It reports resident memory after warm-up and at the end (the target: flat within 5 %), the
scrape latency p50/p99 (target: p99 under 5 ms), the page size, and whether the agent stayed
ready. Exit status 1 when memory grew by more than 5 % or the agent died.

Usage: cargo build --release --workspace && python3 benches/big_node.py [--gpus 16]
       [--processes 1000] [--minutes 60] [--json OUT] [--bin PATH/gpu-steward]
       (--bin: another build, with libnvml_sim.so beside it, to compare builds on one machine)
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")


def get(port, path, gz=False):
    start = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    extra = "Accept-Encoding: gzip\r\n" if gz else ""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
    chunks = []
    while True:
        b = s.recv(262144)
        if not b:
            break
        chunks.append(b)
    s.close()
    elapsed = (time.perf_counter() - start) * 1000
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body, elapsed


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def private_kib(pid):
    """Private_Clean + Private_Dirty of smaps_rollup: the memory only this process holds (RSS
    also counts the executable's and libraries' pages shared with the page cache)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def memfds(pid):
    """(count, KiB) of the agent's memfd pages (/metrics served by sendfile): shared memory,
    charged to its cgroup but not to its RSS, so the report adds it."""
    n = size = 0
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return 0, 0
    for fd in fds:
        try:
            if os.readlink(os.path.join(fd_dir, fd)).startswith("/memfd:gpu-steward"):
                n += 1
                size += os.stat(os.path.join(fd_dir, fd)).st_size
        except OSError:
            pass
    return n, size // 1024


def scenario(gpus, pids):
    """`pids`: one list of (pid, instance) per GPU."""
    out = ["version = 1", "", "[driver]", 'version = "580.95.05"', ""]
    for g in range(gpus):
        out += ["[[gpu]]", 'model = "H100-SXM5-80GB"',
                f'pci_bus_id = "00000000:{0x10 + g:02X}:00.0"', "mig_mode = true",
                "mig_devices = [" + ", ".join(['"1g.10gb"'] * 7) + "]",
                f"gpu_util_percent = {random.randint(0, 100)}", ""]
        for pid, _inst in pids[g]:
            out += ["[[gpu.process]]", f"pid = {pid}", f"used_memory_mib = {random.randint(100, 9000)}",
                    f"sm_util_percent = {random.randint(0, 100)}", 'mig_device = "1g.10gb"', ""]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--processes", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the first RSS figure")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--bin", default=os.path.join(REL, "gpu-steward"))
    args = ap.parse_args()
    random.seed(args.seed)
    agent_bin = args.bin
    sim = os.path.join(os.path.dirname(agent_bin), "libnvml_sim.so")
    for p in (agent_bin, sim):
        if not os.path.exists(p):
            raise SystemExit(f"{p} missing: run `cargo build --release --workspace` first")
    work = tempfile.mkdtemp(prefix="gs-big-")
    scen = os.path.join(work, "scenario.toml")
    next_pid = [200000]

    def fresh(g):
        next_pid[0] += 1
        return (next_pid[0], random.randrange(7))

    per_gpu = [args.processes // args.gpus + (1 if g < args.processes % args.gpus else 0)
               for g in range(args.gpus)]
    pids = [[fresh(g) for _ in range(per_gpu[g])] for g in range(args.gpus)]

    def write():
        tmp = scen + ".tmp"
        with open(tmp, "w") as f:
            f.write(scenario(args.gpus, pids))
        os.rename(tmp, scen)

    write()
    port_sock = socket.socket()
    port_sock.bind(("127.0.0.1", 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    env = dict(os.environ, NVML_SIM_SCENARIO=scen, RUST_LOG="warn",
               NVML_SIM_COST=os.path.join(ROOT, "nvml-sim/costs/h100-driver-580.json"))
    log = open(os.path.join(work, "agent.log"), "w")
    agent = subprocess.Popen([agent_bin, "run", "--listen", f"127.0.0.1:{port}", "--nvml-lib", sim,
                              "--interval", "1s", "--config", "/dev/null"],
                             env=env, stdout=subprocess.DEVNULL, stderr=log)
    failures = []
    latencies = {"plain": [], "gzip": []}
    rss = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if get(port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise SystemExit("the agent did not become ready within 60 s")
        start = time.time()
        end = start + args.minutes * 60
        last_churn = start
        n = 0
        page = 0
        while time.time() < end:
            if agent.poll() is not None:
                failures.append(f"the agent exited with {agent.returncode}")
                break
            gz = n % 2 == 1
            status, body, ms = get(port, "/metrics", gz)
            if status != 200:
                failures.append(f"/metrics answered {status}")
            elif time.time() - start >= args.warmup:
                latencies["gzip" if gz else "plain"].append(ms)
            if not gz:
                page = len(body)
            ready = get(port, "/readyz")[0]
            if ready != 200:
                failures.append(f"/readyz answered {ready} at {time.time() - start:.0f} s")
            if n % 10 == 0:
                rss.append((time.time() - start, rss_kib(agent.pid)) + memfds(agent.pid)
                           + (private_kib(agent.pid),))
            if time.time() - last_churn >= 60:
                last_churn = time.time()
                for g in range(args.gpus):
                    for i in random.sample(range(len(pids[g])), max(1, len(pids[g]) // 10)):
                        pids[g][i] = fresh(g)
                write()
            n += 1
            time.sleep(max(0.0, 1.0 - (time.time() % 1.0)))
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            failures.append("the agent did not stop within 10 s of SIGTERM")
    after_warmup = [k for t, k, _, _, _ in rss if t >= args.warmup]
    memfd_counts = [c for t, _, c, _, _ in rss if t >= args.warmup]
    memfd_kib = [k for t, _, _, k, _ in rss if t >= args.warmup]
    private = [p for t, _, _, _, p in rss if t >= args.warmup]
    if not after_warmup:
        raise SystemExit("the run was shorter than the warm-up")
    first, last, peak = after_warmup[0], after_warmup[-1], max(after_warmup)
    growth = (last - first) / first * 100
    pct = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 100 else max(xs)
    report = {
        "gpus": args.gpus, "mig_instances_per_gpu": 7, "processes": args.processes,
        "minutes": args.minutes, "page_bytes": page,
        "rss_mib_after_warmup": first / 1024, "rss_mib_at_end": last / 1024,
        "rss_mib_peak": peak / 1024, "rss_growth_percent": growth,
        "private_mib_after_warmup": private[0] / 1024, "private_mib_at_end": private[-1] / 1024,
        "memfd_mib_at_end": memfd_kib[-1] / 1024 if memfd_kib else 0,
        "memfd_count_max": max(memfd_counts, default=0),
        "scrapes": {k: {"count": len(v), "p50_ms": statistics.median(v), "p99_ms": pct(v, 99)}
                    for k, v in latencies.items() if v},
        "failures": failures[:20],
    }
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if failures or growth > 5:
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The agent's memory over the NVML floor, on the simulated real H100: a proxy for
`benches/real-check/mem-probe.sh` on a machine without a GPU.

`nvml_min` (benches/real-check/nvml_min.c: load NVML, read four fields once a second) and the
agent (`run`, 1 s poll) load the same library, the simulator under the name
`libnvidia-ml.so.1`, side by side, with `tests/scenarios/real-h100.toml` and the H100 cost
model. After a few scrapes and `--seconds` it prints both processes' VmRSS, RssAnon and
RssFile, the agent's RSS over the floor, and its executable's mapped pages by mapping.

The driver's own memory (14.7 MiB of the 20.8 MiB floor on the H100) is not simulated, so only
the difference means anything. It tracks the GPU's: on 2026-11-23 this printed +6.4 MiB for
the release build of commit 545f411, and mem-probe.sh on the H100 gave +6.4 MiB for the same
layout (BENCHMARKS.md). Use it to see whether a change moves the figure; measure the figure
itself on a GPU.

Usage: cargo build --release --workspace && python3 benches/floor.py [--seconds 45] [--bin B]
"""
import argparse
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")


def status(pid):
    text = open(f"/proc/{pid}/status").read()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) for k in
            ("VmRSS", "RssAnon", "RssFile")}


def exe_mappings(pid):
    """(permissions, kB resident) of each mapping of the process's own executable."""
    exe = os.readlink(f"/proc/{pid}/exe")
    out, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                cur = fields[1] if len(fields) >= 6 and fields[5] == exe else None
            elif cur and fields[0] == "Rss:":
                out.append((cur, int(fields[1])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=45)
    ap.add_argument("--bin", default=os.path.join(REL, "gpu-steward"))
    args = ap.parse_args()
    sim = os.path.join(REL, "libnvml_sim.so")
    for p in (args.bin, sim):
        if not os.path.exists(p):
            raise SystemExit(f"{p} missing: run `cargo build --release --workspace` first")
    work = tempfile.mkdtemp(prefix="gs-floor-")
    lib = os.path.join(work, "libnvidia-ml.so.1")
    os.symlink(sim, lib)
    nvml_min = os.path.join(work, "nvml_min")
    subprocess.run(["gcc", "-O2", "-o", nvml_min,
                    os.path.join(ROOT, "benches", "real-check", "nvml_min.c"), "-ldl"], check=True)
    env = dict(os.environ, RUST_LOG="warn", LD_LIBRARY_PATH=work,
               NVML_SIM_SCENARIO=os.path.join(ROOT, "tests", "scenarios", "real-h100.toml"),
               NVML_SIM_COST=os.path.join(ROOT, "nvml-sim", "costs",
                                          "h100-driver-580.json"))
    floor = subprocess.Popen([nvml_min, str(args.seconds + 20)], env=env,
                             stdout=subprocess.DEVNULL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = subprocess.Popen([args.bin, "run", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
                              "--nvml-lib", lib, "--config", "/dev/null"], env=env,
                             stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "agent.log"), "w"))
    try:
        time.sleep(10)
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited: see {work}/agent.log")
        base = f"http://127.0.0.1:{port}"
        for _ in range(5):
            for path, headers in (("/metrics", {}), ("/metrics", {"Accept-Encoding": "gzip"}),
                                  ("/readyz", {}), ("/health", {})):
                urllib.request.urlopen(urllib.request.Request(base + path, headers=headers)).read()
        time.sleep(max(args.seconds - 10, 5))
        f, a = status(floor.pid), status(agent.pid)
        maps = exe_mappings(agent.pid)
    finally:
        agent.terminate()
        agent.wait(10)
        floor.kill()
        floor.wait()
    print("| | VmRSS | RssAnon | RssFile |\n|---|---|---|---|")
    for name, s in (("nvml_min (simulated NVML)", f), ("gpu-steward", a)):
        print(f"| {name} | {s['VmRSS'] / 1024:.1f} MiB | {s['RssAnon'] / 1024:.1f} MiB | "
              f"{s['RssFile'] / 1024:.1f} MiB |")
    print(f"\nover the floor: {(a['VmRSS'] - f['VmRSS']) / 1024:+.1f} MiB; the executable mapped "
          f"{sum(k for _, k in maps) / 1024:.1f} MiB (" +
          ", ".join(f"{perm} {k / 1024:.2f}" for perm, k in maps) + ")")


if __name__ == "__main__":
    main()

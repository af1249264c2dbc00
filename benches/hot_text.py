#!/usr/bin/env python3
"""Regenerates link/hot-text.ld, the layout that packs the functions the daemon runs together.

Why: the kernel maps an executable's code into a process 64 KiB (or one page-cache folio) around
every page it touches, and counts all of it in RSS. Spread over the 9 MB `.text` in link order,
the ~1.8 MB of functions a running agent touches kept 6.8 MiB of it mapped. Gathered into one
`.text.hot` output section, they keep about their own size.

How: run the release binary under valgrind's callgrind on the simulated 8xH100 node (with the built-in
defaults, then with the packaged config) and on the simulated real H100 (tests/scenarios), polling at 1 s and serving every
read-only endpoint; every function that executed at least once is hot. The linker's map (build.rs
writes it when GPU_STEWARD_LINK_MAP is set) names the input section of each function (identical
functions are merged into one section under several names). Names are v0-mangled
(.cargo/config.toml): crate disambiguators become `*`, so the script survives rebuilds.

Usage: python3 benches/hot_text.py [--seconds 30] [--check]
  --check  only relink and report how much of the executed code sits in `.text.hot`.
Needs valgrind (Debian package `valgrind`) and curl.
"""
import argparse
import collections
import http.client
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/gpu-steward")
SIM = os.path.join(ROOT, "target/release/libnvml_sim.so")
MAP = os.path.join(ROOT, "target/release/gpu-steward.map")
SCRIPT = os.path.join(ROOT, "link/hot-text.ld")
SCENARIOS = os.path.join(ROOT, "tests/scenarios")
PATHS = ["/metrics", "/livez", "/readyz", "/health", "/health/gpus", "/nope"]


def build():
    env = dict(os.environ, GPU_STEWARD_LINK_MAP=MAP)
    subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=ROOT, env=env, check=True)


# Prometheus's scrape request (keep-alive, no `Connection` header): the connection answers it
# itself (src/http/fast.rs), so it must be in the profile as such.
SCRAPE_HEADERS = {
    "User-Agent": "Prometheus/3.0.0",
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}


def get(port, path, headers=None, conn=None):
    """GET on `conn` (kept open, as Prometheus does) or on a fresh connection (as probes do)."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        r.read()
        return r.status
    except OSError:
        return None
    finally:
        if conn is None:
            c.close()


def profile(scenario, args, port, seconds, out):
    """Runs the agent under callgrind, serving scrapes for `seconds` after it is ready."""
    cmd = ["valgrind", "--tool=callgrind", "--demangle=no", "--compress-strings=no",
           "--compress-pos=no", f"--callgrind-out-file={out}", BIN, "demo",
           "--scenario", os.path.join(SCENARIOS, scenario), "--nvml-lib", SIM,
           "--listen", f"127.0.0.1:{port}", "--interval", "1s"] + args
    log = open(out + ".log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while get(port, "/readyz") != 200:
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            sys.exit(f"the agent under valgrind did not get ready: see {out}.log")
        time.sleep(1)
    scraper = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    end = time.time() + seconds
    while time.time() < end:
        for path in PATHS:
            get(port, path, headers={"Connection": "close"})
        get(port, "/metrics", SCRAPE_HEADERS, conn=scraper)
        get(port, "/metrics", dict(SCRAPE_HEADERS, **{"Accept-Encoding": "gzip"}), conn=scraper)
        time.sleep(1)
    scraper.close()
    p.terminate()
    p.wait(timeout=120)


def self_costs(path):
    """Function name -> instructions executed in its own body, from a callgrind output file."""
    costs = collections.Counter()
    fn, after_calls = None, False
    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = line[3:].strip()
                costs[fn] += 0
            elif line.startswith("calls="):
                after_calls = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if after_calls:  # the inclusive cost of a call, not this function's own
                    after_calls = False
                    continue
                parts = line.split()
                if fn and len(parts) >= 2:
                    costs[fn] += int(parts[1])
    return costs


def sections_by_symbol(path):
    """Symbol -> the input section that holds it, from lld's map (VMA LMA Size Align Out In Sym)."""
    owner, section = {}, None
    with open(path) as f:
        for line in f:
            m = re.search(r":\((\.[^)]*)\)$", line)
            if m:
                section = m.group(1)
                continue
            parts = line.split()
            if len(parts) == 5 and section is not None:
                owner.setdefault(parts[4], section)
    return owner


def pattern(section):
    """Input-section patterns that still match after a rebuild, or None for non-code sections."""
    m = re.match(r"\.text(?:\.unlikely)?\.(.+)$", section)
    if not m:
        return None
    name = re.sub(r"\.llvm\.\d+$", "", m.group(1))
    if name.startswith("_R"):
        name = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", name)
    elif name.startswith("_ZN"):
        name = re.sub(r"17h[0-9a-f]{16}E$", "17h*E", name)
    return " ".join(f"{p}{name}{s}" for p in (".text.", ".text.unlikely.") for s in ("", ".llvm.*"))


def text_hot_range():
    out = subprocess.run(["readelf", "-SW", BIN], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == ".text.hot":
            return int(parts[3], 16), int(parts[5], 16)
    return None


def check(executed):
    """How much of the executed code the current binary keeps inside `.text.hot`."""
    hot = text_hot_range()
    nm = subprocess.run(["nm", "-S", "--defined-only", BIN], capture_output=True, text=True,
                        check=True).stdout
    inside = outside = 0
    strays = []
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] in executed:
            addr, size = int(parts[0], 16), int(parts[1], 16)
            if hot and hot[0] <= addr < hot[0] + hot[1]:
                inside += size
            else:
                outside += size
                strays.append(parts[3])
    size = hot[1] if hot else 0
    print(f"executed code: {inside} B inside .text.hot ({size} B), {outside} B in "
          f"{len(strays)} functions outside")
    for s in strays[:10]:
        print("  outside:", s)
    return outside


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    build()
    with tempfile.TemporaryDirectory() as tmp:
        costs = collections.Counter()
        packaged = ["--config", os.path.join(ROOT, "packaging/deb/config.toml")]
        runs = [("dgx-h100.toml", [], 9491), ("dgx-h100.toml", packaged, 9492),
                ("real-h100.toml", packaged, 9493)]
        for scenario, extra, port in runs:
            out = os.path.join(tmp, f"callgrind.{port}")
            profile(scenario, extra, port, args.seconds, out)
            costs.update(self_costs(out))
    owner = sections_by_symbol(MAP)
    executed = {fn for fn in costs if fn in owner}
    if args.check:
        check(executed)
        return
    patterns, seen = [], set()
    for fn, _ in sorted(costs.items(), key=lambda kv: (-kv[1], kv[0])):
        p = pattern(owner[fn]) if fn in owner else None
        if p and p not in seen:
            seen.add(p)
            patterns.append(p)
    rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.dirname(SCRIPT), exist_ok=True)
    with open(SCRIPT, "w") as f:
        f.write("/* Generated by benches/hot_text.py (commit %s, %s): the %d code sections that\n"
                "   ran on the simulated nodes, hottest first. Linked into release builds by\n"
                "   build.rs; see BENCHMARKS.md, \"Memory against the NVML floor\". */\n"
                % (rev, time.strftime("%Y-%m-%d"), len(patterns)))
        f.write("SECTIONS\n{\n  .text.hot : {\n")
        for p in patterns:
            f.write(f"    *({p})\n")
        f.write("  }\n}\nINSERT BEFORE .text;\n")
    print(f"wrote {SCRIPT}: {len(patterns)} sections from {len(executed)} executed functions")
    build()
    check(executed)


if __name__ == "__main__":
    main()

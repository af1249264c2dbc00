#!/usr/bin/env python3
"""/metrics under concurrent scrapers, side by side in one run: gpu-steward against nginx serving
the identical bytes from a file (the physical limit for serving them) and against the tutorial
exporter (Python prometheus_client + nvidia-ml-py) reading the same simulated NVML.

Each target gets `--rounds` runs of `wrk -t THREADS -c CONNECTIONS -d SECONDS --latency`,
interleaved (A B C A B C ...) so that whatever else the machine does falls on all of them alike;
the report gives each target's median requests/s, p50 and p99 latency, and the ratios. Two
kinds of scrape: plain, and `Accept-Encoding: gzip` as Prometheus sends it (nginx then serves a
pre-compressed copy with gzip_static, the cheapest way to serve gzip). NVML costs follow the
real H100's cost model (NVML_SIM_COST) so that the agent's polling costs what it would.

Needs: wrk and nginx (Debian: wrk nginx-light); for the tutorial exporter, python3 modules
pynvml (nvidia-ml-py) and prometheus_client (skipped, loudly, when missing).

Usage: cargo build --release --workspace && python3 benches/scrape.py [--gpus 8]
       [--seconds 10] [--rounds 3] [--connections 16] [--threads 2] [--nginx-workers N]
       [--json OUT]
"""
import argparse
import gzip
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, seconds=30, headers=None, proc=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server for {url} exited with status {proc.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return r.read()
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {seconds} s")


def scenario_for(gpus):
    with open(os.path.join(ROOT, "tests", "scenarios", "dgx-h100.toml")) as f:
        text = f.read()
    if gpus == 8:
        return text
    # The 8×H100 node, its [[gpu]] entries repeated with fresh bus ids up to `gpus`.
    head, *entries = text.split("[[gpu]]")
    out = [head]
    for i in range(gpus):
        e = entries[i % len(entries)]
        e = re.sub(r'pci_bus_id = "[^"]*"', f'pci_bus_id = "00000000:{0x10 + i:02X}:00.0"', e)
        e = re.sub(r'uuid = "[^"]*"\n', "", e)
        e = re.sub(r'serial = "[^"]*"\n', "", e)
        out.append("[[gpu]]" + e)
    return "".join(out)


def rss_mib(pid):
    """Resident memory of a process and its children (nginx's workers), MiB."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def wrk(url, args, gz):
    cmd = ["wrk", "-t", str(args.threads), "-c", str(args.connections), "-d", f"{args.seconds}s",
           "--latency"]
    if gz:
        cmd += ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout

    def latency(pct):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50_ms": latency(50), "p99_ms": latency(99),
            "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sock.group(1) if sock else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nginx-workers", type=int, default=os.cpu_count() or 2,
                    help="nginx worker processes (default: one per CPU; the agent serves HTTP "
                         "on 2 threads, so 2 compares equal thread budgets on a big machine)")
    ap.add_argument("--json")
    args = ap.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"{tool} not found (Debian: apt-get install wrk nginx-light)")
    agent_bin = os.path.join(REL, "gpu-steward")
    sim = os.path.join(REL, "libnvml_sim.so")
    for p in (agent_bin, sim):
        if not os.path.exists(p):
            raise SystemExit(f"{p} missing: run `cargo build --release --workspace` first")

    work = tempfile.mkdtemp(prefix="gs-scrape-")
    # nginx's workers run as `nobody` when started by root: they must be able to read the page.
    os.chmod(work, 0o755)
    procs = []
    try:
        scen = os.path.join(work, "scenario.toml")
        with open(scen, "w") as f:
            f.write(scenario_for(args.gpus))
        env = dict(os.environ, NVML_SIM_SCENARIO=scen,
                   NVML_SIM_COST=os.path.join(ROOT, "nvml-sim/costs/h100-driver-580.json"),
                   RUST_LOG="warn")
        agent_port = free_port()
        procs.append(subprocess.Popen(
            [agent_bin, "run", "--listen", f"127.0.0.1:{agent_port}", "--nvml-lib", sim,
             "--interval", "1s", "--config", "/dev/null"], env=env,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "agent.log"), "w")))
        agent = f"http://127.0.0.1:{agent_port}/metrics"
        wait_http(f"http://127.0.0.1:{agent_port}/readyz")
        body = wait_http(agent)
        root = os.path.join(work, "www")
        os.makedirs(root)
        with open(os.path.join(root, "metrics"), "wb") as f:
            f.write(body)
        with open(os.path.join(root, "metrics.gz"), "wb") as f:
            f.write(gzip.compress(body, 6))
        nginx_port = free_port()
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""
worker_processes {args.nginx_workers};
pid {work}/nginx.pid;
error_log {work}/nginx.err warn;
daemon off;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on; tcp_nopush on; tcp_nodelay on;
  keepalive_requests 1000000; keepalive_timeout 60s;
  open_file_cache max=16 inactive=60s;
  gzip_static on;
  types {{ }}
  default_type "text/plain; version=0.0.4; charset=utf-8";
  client_body_temp_path {work}/cb; proxy_temp_path {work}/px; fastcgi_temp_path {work}/fc;
  uwsgi_temp_path {work}/uw; scgi_temp_path {work}/sc;
  server {{ listen 127.0.0.1:{nginx_port}; root {root}; location = /metrics {{ }} }}
}}
""")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        procs.append(subprocess.Popen([nginx, "-c", conf, "-p", work],
                                      stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(work, "nginx.log"), "w")))
        nginx_url = f"http://127.0.0.1:{nginx_port}/metrics"
        wait_http(nginx_url, proc=procs[-1])
        targets = {"gpu-steward": agent, "nginx (same bytes)": nginx_url}
        pids = {"gpu-steward": procs[0].pid, "nginx (same bytes)": procs[1].pid}

        tutorial = None
        probe = subprocess.run([sys.executable, "-c", "import pynvml, prometheus_client"],
                               capture_output=True)
        if probe.returncode == 0:
            libdir = os.path.join(work, "lib")
            os.makedirs(libdir)
            os.symlink(sim, os.path.join(libdir, "libnvidia-ml.so.1"))
            tport = free_port()
            tenv = dict(env, LD_LIBRARY_PATH=libdir)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "benches/real-check/seed_exporter.py"),
                 str(tport), "1"], env=tenv, stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(work, "tutorial.log"), "w")))
            tutorial = f"http://127.0.0.1:{tport}/metrics"
            wait_http(tutorial, proc=procs[-1])
            targets["tutorial exporter"] = tutorial
            pids["tutorial exporter"] = procs[-1].pid
        else:
            print("SKIPPED: the tutorial exporter (python3 cannot import pynvml and "
                  "prometheus_client; pip install nvidia-ml-py prometheus_client)", file=sys.stderr)

        results = {}
        for gz in (False, True):
            kind = "gzip" if gz else "plain"
            for r in range(args.rounds):
                for name, url in targets.items():
                    res = wrk(url, args, gz)
                    results.setdefault(kind, {}).setdefault(name, []).append(res)
                    print(f"{kind:5} round {r + 1} {name:20} {res['rps']:10.0f} req/s  "
                          f"p50 {res['p50_ms']} ms  p99 {res['p99_ms']} ms"
                          + (f"  non-2xx {res['non2xx']}" if res["non2xx"] else ""),
                          file=sys.stderr)

        rss = {name: rss_mib(pid) for name, pid in pids.items()}
        report = {"gpus": args.gpus, "rss_mib_after": rss, "body_bytes": len(body),
                  "body_gzip_bytes": len(gzip.compress(body, 6)),
                  "wrk": {"threads": args.threads, "connections": args.connections,
                          "seconds": args.seconds, "rounds": args.rounds},
                  "cpus": os.cpu_count(), "nginx_workers": args.nginx_workers, "results": {}}
        print(f"\n/metrics of {args.gpus} GPUs: {len(body)} bytes "
              f"({report['body_gzip_bytes']} gzipped); wrk -t{args.threads} "
              f"-c{args.connections} -d{args.seconds}s, median of {args.rounds} interleaved rounds, "
              f"{os.cpu_count()} CPUs, nginx with {args.nginx_workers} workers, the agent with 2 "
              f"HTTP threads")
        print(f"{'scrape':6} {'target':20} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'vs nginx':>9}")
        for kind, per in results.items():
            base = statistics.median(x["rps"] for x in per["nginx (same bytes)"])
            for name, runs in per.items():
                med = {k: statistics.median(x[k] for x in runs if x[k] is not None)
                       for k in ("rps", "p50_ms", "p99_ms")}
                med["ratio_to_nginx"] = med["rps"] / base
                med["non2xx"] = sum(x["non2xx"] for x in runs)
                report["results"].setdefault(kind, {})[name] = med
                print(f"{kind:6} {name:20} {med['rps']:10.0f} {med['p50_ms']:8.3f} "
                      f"{med['p99_ms']:8.3f} {med['ratio_to_nginx']:8.2f}x")
        print("resident memory after the runs: " + ", ".join(
            f"{name} {mib:.1f} MiB" for name, mib in rss.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measures a running gpu-steward from outside: CPU time (ns), RSS, the `poll complete` debug log
lines and the agent's own counters, over a window. Stdlib only. Used by `real-check.sh` and, as a
module, by `benches/poll_cost.py`.

CPU is measured three ways, because threads come and go (per-GPU workers, tokio's blocking pool):
- `tids_ns`: the first field of /proc/PID/task/TID/schedstat (the scheduler's sum_exec_runtime,
  ns) summed over every thread, sampled every 100 ms so that a thread that exits loses at most
  its last 100 ms; a thread born in the window counts from 0. This is the figure reported.
- `clock_ns`: the process CPU clock (clock_gettime of the pid's CPUCLOCK_SCHED), which includes
  exited threads exactly; a cross-check, absent where the kernel refuses it.
- `ticks_ns`: utime+stime of /proc/PID/stat (clock ticks, usually 10 ms); a coarse cross-check.

usage (what real-check.sh runs):
  agent_meter.py measure --pid PID [--port PORT] [--log FILE] --seconds N [--interval 1s]
                         [--label NAME] [--json OUT]
      measures N seconds and prints one summary block (CPU, RSS, polls, poll wall times, the
      top of gpu_steward_nvml_call_seconds_total)
  agent_meter.py wait-poll --port PORT --out FILE [--timeout S]
      waits until the agent completes a poll, then saves /metrics to FILE
  agent_meter.py port --log FILE [--pid PID | --handshake DIR] [--timeout S] [--ready]
      prints the port from the agent's `listening on 127.0.0.1:PORT` log line; with --ready,
      then waits for /readyz 200 and prints the seconds that took too ('PORT SECONDS'), from
      the agent's start when started first with --handshake (see wait_port)
  agent_meter.py ready --port PORT [--timeout S]
      waits for GET /readyz 200 and prints the seconds it took
  agent_meter.py get --port PORT --out-prefix PREFIX /PATH...
      saves each body to PREFIX + path ('/' as '_') + '.txt'; prints 'GET /PATH -> STATUS'
      (000: no connection)
"""
import argparse
import json
import math
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
# Threads the simulated NVML starts in the agent's process (nvml-sim/src/stats.rs THREAD_NAME).
SIM_THREAD_PREFIX = "nvml-sim"


class HarnessError(Exception):
    """Something the measurement needs is missing: the harness cannot go on."""


# ---------- HTTP and the exposition format ----------

def http_get(port, path, timeout=5.0):
    """(status, body bytes) of GET http://127.0.0.1:PORT/PATH; an HTTP error status is returned,
    a connection failure raises OSError."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except urllib.error.URLError as e:
        raise OSError(f"GET http://127.0.0.1:{port}{path}: {e.reason}") from e


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """Prometheus text format -> {name: [(labels dict, value float)]}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {}
        if m.group(2):
            for lm in _LABEL.finditer(m.group(2)[1:-1]):
                labels[lm.group(1)] = (lm.group(2).replace('\\"', '"').replace("\\n", "\n")
                                       .replace("\\\\", "\\"))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def scalar(metrics, name):
    """The value of an unlabelled series, or None."""
    for labels, v in metrics.get(name, []):
        if not labels:
            return v
    return None


def by_label(metrics, name, label):
    """{label value: sample value} of one metric; None when the metric is absent."""
    if name not in metrics:
        return None
    return {labels.get(label, ""): v for labels, v in metrics[name]}


def scrape(port):
    status, body = http_get(port, "/metrics")
    if status != 200:
        raise HarnessError(f"GET /metrics answered {status}: {body[:200]!r}")
    return parse_metrics(body.decode("utf-8", "replace"))


# ---------- durations ----------

def parse_duration(s):
    """'100ms', '1s', '1.5s', '2m' -> seconds (float)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid duration '{s}'; write it like 100ms, 1s or 2m")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def fmt_duration(sec):
    return f"{sec * 1000:g}ms" if sec < 1 else f"{sec:g}s"


# ---------- CPU and memory of a process ----------

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M)
    return int(m.group(1)) if m else None


def stat_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces and parentheses: split after its closing ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def process_clock_ns(pid):
    """CPU time of the whole process, exited threads included (Linux's CPUCLOCK_SCHED of the pid,
    as clock_getcpuclockid(3) computes it); None where the kernel refuses."""
    clock_id = ((~pid) << 3) | 2
    try:
        return time.clock_gettime_ns(clock_id)
    except (OSError, OverflowError):
        return None


def thread_name(pid, tid):
    """The thread's name (comm), digits at the end folded to '*' so that per-GPU workers
    (gpu-0 .. gpu-7) add up under one name."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return "?"
    return re.sub(r"([-_ ])\d+$", r"\1*", name)


def thread_ns(pid):
    """{tid: sum_exec_runtime ns} of the live threads; {} if schedstat is unavailable."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue  # the thread exited between listdir and open
    return out


class CpuMeter:
    """CPU time of a process over a window, threads coming and going included (see the module
    docstring). start() and stop() bracket the window; a sampler thread runs in between."""

    def __init__(self, pid, every=0.1):
        self.pid = pid
        self.every = every
        self._base = {}
        self._last = {}
        self._names = {}
        self._stop = threading.Event()
        self._thread = None
        self.schedstat = os.path.exists(f"/proc/{pid}/task/{pid}/schedstat")

    def _sample(self):
        for tid, ns in thread_ns(self.pid).items():
            if tid not in self._base:
                self._base[tid] = 0  # born in the window
            if tid not in self._names:
                self._names[tid] = thread_name(self.pid, tid)
            self._last[tid] = ns

    def _run(self):
        while not self._stop.wait(self.every):
            self._sample()

    def start(self):
        self.t0 = time.monotonic_ns()
        now = thread_ns(self.pid)
        self._base = dict(now)
        self._last = dict(now)
        self._names = {tid: thread_name(self.pid, tid) for tid in now}
        self.threads_at_start = len(now)
        self.clock0 = process_clock_ns(self.pid)
        self.ticks0 = stat_ticks(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._sample()
        clock1 = process_clock_ns(self.pid)
        ticks1 = stat_ticks(self.pid)
        t1 = time.monotonic_ns()
        self._stop.set()
        self._thread.join()
        tids_ns = sum(self._last[t] - self._base[t] for t in self._last) if self.schedstat else None
        clock_ns = clock1 - self.clock0 if clock1 is not None and self.clock0 is not None else None
        ticks_ns = (ticks1 - self.ticks0) * TICK_NS
        by_thread = {}
        for tid, ns in self._last.items():
            name = self._names.get(tid, "?")
            by_thread[name] = by_thread.get(name, 0) + ns - self._base[tid]
        # The simulator's own threads (nvml-sim-stats writes its call counts) do work no driver
        # does: left out of the agent's CPU, reported beside it. None on a real GPU.
        sim_ns = sum(ns for name, ns in by_thread.items()
                     if name.startswith(SIM_THREAD_PREFIX)) if self.schedstat else 0
        best = (tids_ns - sim_ns if tids_ns is not None else
                clock_ns if clock_ns is not None else ticks_ns)
        return {
            "window_ns": t1 - self.t0,
            "cpu_ns": best,
            "sim_thread_ns": sim_ns,
            "method": "schedstat" if tids_ns is not None else
                      "process clock" if clock_ns is not None else "utime+stime ticks",
            "tids_ns": tids_ns,
            "clock_ns": clock_ns,
            "ticks_ns": ticks_ns,
            "by_thread_ns": by_thread if self.schedstat else None,
            "threads_seen": len(self._last),
            "threads_at_start": self.threads_at_start,
            "threads_at_end": len(thread_ns(self.pid)),
        }


def cpu_cross_check(cpu):
    """A warning when the three CPU measures disagree more than their precision explains."""
    notes = []
    # The cross-checks count the whole process, the simulator's own threads included.
    best = cpu["cpu_ns"] + cpu.get("sim_thread_ns", 0)
    if cpu["clock_ns"] is not None and best:
        # The sampled sum misses at most the last 100 ms of each exited thread.
        if abs(cpu["clock_ns"] - best) > max(0.05 * best, 2e6):
            notes.append(f"schedstat sum {best / 1e6:.1f} ms vs process clock "
                         f"{cpu['clock_ns'] / 1e6:.1f} ms (threads that exited mid-window?)")
    if abs(cpu["ticks_ns"] - best) > max(0.1 * best, 3 * TICK_NS):
        notes.append(f"schedstat sum {best / 1e6:.1f} ms vs utime+stime "
                     f"{cpu['ticks_ns'] / 1e6:.0f} ms")
    return notes


def thread_split(by_thread_ns, window_ns, polls=None):
    """'poller 1.90 ms, xid-watcher 0.40 ms' per poll (or '% of a core' without polls),
    largest first; threads that used nothing left out."""
    parts = []
    for name, ns in sorted(by_thread_ns.items(), key=lambda kv: -kv[1]):
        if ns <= 0:
            continue
        if polls:
            parts.append(f"{name} {ns / polls / 1e6:.2f} ms")
        else:
            parts.append(f"{name} {100 * ns / window_ns:.2f} %")
    return ", ".join(parts) + (" per poll" if polls else " of a core")


# ---------- the agent's log ----------

class PollLog:
    """Collects the agent's `poll complete` debug lines (JSON log format):
    {"fields":{"message":"poll complete","poll":12,"wall_us":1834,"slow_gpus":1},...}.
    feed() takes one line; other lines are kept in `other` (last 200) and counted by level."""

    def __init__(self):
        self.polls = []  # (poll, wall_us or None, slow_gpus or None)
        self.other = []
        self.levels = {}
        self.lock = threading.Lock()

    def feed(self, line):
        line = line.strip()
        if not line:
            return
        rec = None
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
        with self.lock:
            if not isinstance(rec, dict):
                self._keep("unparsed", line)
                return
            fields = rec.get("fields") or {}
            level = str(rec.get("level", "?"))
            if fields.get("message") == "poll complete":
                self.levels[level] = self.levels.get(level, 0) + 1
                self.polls.append((fields.get("poll"), fields.get("wall_us"), fields.get("slow_gpus")))
            else:
                self._keep(level, line)

    def _keep(self, level, line):
        self.levels[level] = self.levels.get(level, 0) + 1
        self.other.append((level, line))
        del self.other[:-200]

    def last_poll(self):
        with self.lock:
            nums = [p for p, _, _ in self.polls if isinstance(p, int)]
            return max(nums) if nums else None

    def window(self, after, upto):
        """The poll records with after < poll <= upto (None bounds: everything)."""
        with self.lock:
            return [r for r in self.polls if isinstance(r[0], int)
                    and (after is None or r[0] > after) and (upto is None or r[0] <= upto)]

    def problems(self):
        """WARN/ERROR lines and lines that are not JSON (panics, the simulator's own messages)."""
        with self.lock:
            return [ln for level, ln in self.other if level in ("unparsed", "WARN", "ERROR")]


def percentile(xs, q):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def poll_stats(records):
    """Wall-time statistics of `poll complete` records, with notes on what is missing."""
    out = {"logged_polls": len(records), "notes": []}
    walls = [w for _, w, _ in records if isinstance(w, (int, float))]
    if records and len(walls) < len(records):
        out["notes"].append(f"{len(records) - len(walls)} `poll complete` lines without wall_us")
    if walls:
        out.update(wall_p50_ms=percentile(walls, 50) / 1000, wall_p99_ms=percentile(walls, 99) / 1000,
                   wall_max_ms=max(walls) / 1000)
    with_slow = [r for r in records if isinstance(r[2], int)]
    if records and not with_slow:
        out["notes"].append("`poll complete` lines carry no slow_gpus field: slow-tier polls unknown")
    slow = [w for _, w, s in with_slow if s > 0 and isinstance(w, (int, float))]
    out["slow_polls"] = len(slow) if with_slow else None
    out["slow_wall_max_ms"] = max(slow) / 1000 if slow else None
    return out


def nvml_growth(before, after, polls):
    """Top NVML functions by growth of gpu_steward_nvml_call_seconds_total over the window:
    [(function, ms per poll, calls per poll or None)], or None when the agent lacks the counter."""
    s0 = by_label(before, "gpu_steward_nvml_call_seconds_total", "function")
    s1 = by_label(after, "gpu_steward_nvml_call_seconds_total", "function")
    if s0 is None or s1 is None or not polls:
        return None
    c0 = by_label(before, "gpu_steward_nvml_calls_total", "function") or {}
    c1 = by_label(after, "gpu_steward_nvml_calls_total", "function") or {}
    rows = []
    for fn, v in s1.items():
        dt = v - s0.get(fn, 0.0)
        calls = (c1[fn] - c0.get(fn, 0.0)) / polls if fn in c1 else None
        rows.append((fn, dt * 1000 / polls, calls))
    rows.sort(key=lambda r: (-r[1], r[0]))
    return rows


# ---------- one measured window (real-check.sh) ----------

class LogTail:
    """Feeds a PollLog from a log file the agent writes, from the current end on."""

    def __init__(self, path, log):
        self.path, self.log = path, log
        self.pos = os.path.getsize(path) if os.path.exists(path) else 0
        self.partial = ""

    def pump(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, errors="replace") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        for ln in lines:
            self.log.feed(ln)


def measure(args):
    pid = args.pid
    if not os.path.exists(f"/proc/{pid}"):
        raise HarnessError(f"process {pid} is not running")
    log = PollLog()
    tail = LogTail(args.log, log) if args.log else None
    if tail:
        tail.pump()  # skip what was logged before the window (pos starts at the end)
    before = scrape(args.port) if args.port else None
    first_poll = log.last_poll()
    meter = CpuMeter(pid)
    meter.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if tail:
            tail.pump()
        if not os.path.exists(f"/proc/{pid}"):
            raise HarnessError(f"process {pid} exited during the measurement")
    cpu = meter.stop()
    after = scrape(args.port) if args.port else None
    if tail:
        tail.pump()
    rss = rss_kib(pid)
    res = {"label": args.label, "pid": pid, "seconds": cpu["window_ns"] / 1e9, "cpu": cpu,
           "cpu_pct": 100.0 * cpu["cpu_ns"] / cpu["window_ns"], "rss_kib": rss,
           "cpu_notes": cpu_cross_check(cpu)}
    polls = None
    if before is not None and after is not None:
        p0, p1 = scalar(before, "gpu_steward_polls_total"), scalar(after, "gpu_steward_polls_total")
        polls = p1 - p0 if p0 is not None and p1 is not None else None
        res["polls"] = polls
        res["poll_duration_s"] = scalar(after, "gpu_steward_poll_duration_seconds")
        res["poll_source_duration_s"] = by_label(after, "gpu_steward_poll_source_duration_seconds",
                                                 "source")
        res["nvml"] = nvml_growth(before, after, polls)
        if polls:
            res["cpu_per_poll_ms"] = cpu["cpu_ns"] / polls / 1e6
    if tail:
        recs = log.window(first_poll, None)
        res["poll_log"] = poll_stats(recs)
        res["poll_log"]["seen_any"] = bool(log.polls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print_measure(res, args.interval)
    return 0


def print_measure(res, interval):
    label = res["label"] or f"pid {res['pid']}"
    rss = f"{res['rss_kib'] / 1024:.1f} MiB" if res["rss_kib"] else "?"
    line = (f"{label}: CPU {res['cpu_pct']:.2f}% of a core over {res['seconds']:.1f} s "
            f"({res['cpu']['method']}), RSS {rss}")
    if res.get("polls") is not None:
        line += f", {res['polls']:.0f} polls"
        if interval:
            line += f" ({res['seconds'] / interval:.0f} expected at {fmt_duration(interval)})"
    if res.get("cpu_per_poll_ms") is not None:
        line += f", {res['cpu_per_poll_ms']:.2f} ms CPU per poll"
    print(line)
    bt = res["cpu"].get("by_thread_ns")
    if bt:
        print("  CPU by thread: " + thread_split(bt, res["cpu"]["window_ns"], res.get("polls")))
    for n in res["cpu_notes"]:
        print(f"  note: CPU measures disagree: {n}")
    if "poll_duration_s" in res:
        d = res["poll_duration_s"]
        print(f"  gpu_steward_poll_duration_seconds (last poll): "
              f"{'absent' if d is None else f'{d * 1000:.2f} ms'}")
        src = res.get("poll_source_duration_s")
        if src:
            top = sorted(src.items(), key=lambda kv: -kv[1])
            print("  gpu_steward_poll_source_duration_seconds (last poll): " +
                  ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in top if v > 0))
        elif src is None:
            print("  gpu_steward_poll_source_duration_seconds: absent from /metrics")
        nv = res.get("nvml")
        if nv is None:
            print("  gpu_steward_nvml_call_seconds_total: absent from /metrics (this agent predates "
                  "it): no per-function NVML cost")
        else:
            print("  top NVML functions by gpu_steward_nvml_call_seconds_total, per poll: " +
                  ", ".join(f"{fn} {ms:.2f} ms" + (f" ({c:g} calls)" if c is not None else "")
                            for fn, ms, c in nv[:8]))
    pl = res.get("poll_log")
    if pl is not None:
        if not pl["seen_any"]:
            print("  `poll complete` log lines: none (this agent predates them, or the log level "
                  "hides debug): no per-poll wall times")
        elif "wall_max_ms" in pl:
            slow = ""
            if pl["slow_polls"] is not None:
                smax = pl["slow_wall_max_ms"]
                slow = (f"; {pl['slow_polls']} slow-tier polls, max "
                        + ("-" if smax is None else f"{smax:.2f} ms"))
            print(f"  poll wall from the log ({pl['logged_polls']} polls): p50 {pl['wall_p50_ms']:.2f} ms, "
                  f"p99 {pl['wall_p99_ms']:.2f} ms, max {pl['wall_max_ms']:.2f} ms{slow}")
        for n in pl["notes"]:
            print(f"  note: {n}")


# ---------- small waits for real-check.sh ----------

def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def wait_port(args):
    """Waits for the agent's `listening on` line (and, with --ready, for /readyz 200).
    With --handshake DIR, this runs before the agent starts, so that python's own start-up does
    not count: it creates DIR/up once waiting, then reads DIR/since (the agent's start, Unix
    seconds, written just before the launch) and DIR/pid."""
    hs = args.handshake
    if hs:
        open(os.path.join(hs, "up"), "w").close()
    deadline = time.monotonic() + args.timeout
    pid = args.pid
    while time.monotonic() < deadline:
        if hs and not pid:
            pid = int(_read(os.path.join(hs, "pid")) or 0) or None
        if os.path.exists(args.log):
            with open(args.log, errors="replace") as f:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
            if m:
                if not args.ready:
                    print(m.group(1))
                    return 0
                args.port, args.pid = int(m.group(1)), pid
                if hs:
                    args.since = float(_read(os.path.join(hs, "since")) or 0) or None
                seconds = wait_ready(args, quiet=True)
                print(f"{m.group(1)} {seconds:.3f}")
                return 0
        if pid and not os.path.exists(f"/proc/{pid}"):
            raise HarnessError(f"the agent (pid {pid}) exited before listening; see {args.log}")
        time.sleep(0.005)
    raise HarnessError(f"no 'listening on 127.0.0.1:PORT' line in {args.log} "
                       f"within {args.timeout:g} s")


def wait_ready(args, quiet=False):
    """Polls /readyz until 200; prints (or, quiet, returns) the seconds since args.since, else
    since the wait began."""
    t0 = time.monotonic()
    last = "no answer"
    while time.monotonic() - t0 < args.timeout:
        try:
            status, body = http_get(args.port, "/readyz", timeout=2)
            if status == 200:
                since = getattr(args, "since", None)
                seconds = time.time() - since if since else time.monotonic() - t0
                if quiet:
                    return seconds
                print(f"{seconds:.3f}")
                return 0
            last = f"{status} {body[:200].decode(errors='replace').strip()}"
        except OSError as e:
            last = str(e)
        pid = getattr(args, "pid", None)
        if pid and not os.path.exists(f"/proc/{pid}"):
            raise HarnessError(f"the agent (pid {pid}) exited before it was ready")
        time.sleep(0.005)
    raise HarnessError(f"/readyz not 200 within {args.timeout:g} s (last: {last})")


def wait_poll(args):
    p0 = scalar(scrape(args.port), "gpu_steward_polls_total")
    if p0 is None:
        raise HarnessError("/metrics has no gpu_steward_polls_total")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        time.sleep(0.02)
        status, body = http_get(args.port, "/metrics")
        if status == 200 and (scalar(parse_metrics(body.decode("utf-8", "replace")),
                                     "gpu_steward_polls_total") or 0) > p0:
            with open(args.out, "wb") as f:
                f.write(body)
            return 0
    raise HarnessError(f"no poll completed within {args.timeout:g} s")


def get(args):
    """GET each path into PREFIX + the path with '/' as '_' + '.txt'; prints 'GET /path -> status'
    (000 when the connection failed)."""
    for path in args.paths:
        try:
            status, body = http_get(args.port, path)
        except OSError as e:
            status, body = 0, f"{e}\n".encode()
        with open(args.out_prefix + path.strip("/").replace("/", "_") + ".txt", "wb") as f:
            f.write(body)
        print(f"GET {path} -> {status:03d}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--pid", type=int, required=True)
    m.add_argument("--port", type=int)
    m.add_argument("--log")
    m.add_argument("--seconds", type=float, required=True)
    m.add_argument("--interval", type=parse_duration)
    m.add_argument("--label", default="")
    m.add_argument("--json")
    w = sub.add_parser("wait-poll")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--timeout", type=float, default=10)
    p = sub.add_parser("port")
    p.add_argument("--log", required=True)
    p.add_argument("--pid", type=int)
    p.add_argument("--timeout", type=float, default=15)
    p.add_argument("--ready", action="store_true")
    p.add_argument("--handshake", metavar="DIR")
    r = sub.add_parser("ready")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--timeout", type=float, default=30)
    g = sub.add_parser("get")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--out-prefix", required=True)
    g.add_argument("paths", nargs="+")
    args = ap.parse_args(argv)
    try:
        return {"measure": measure, "wait-poll": wait_poll, "port": wait_port,
                "ready": wait_ready, "get": get}[args.cmd](args)
    except (HarnessError, OSError) as e:
        print(f"agent_meter: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agent_meter: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

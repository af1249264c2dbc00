#!/usr/bin/env python3
"""The packaged config shows every key the agent accepts, and nothing else.

Usage: check_config_keys.py GPU_STEWARD CONFIG_TOML

The list of keys comes from the agent itself, not from a copy that could drift: for each table,
`gpu-steward check-config` is given a file with one unknown key there, and its error names every
key the table accepts ("unknown field `x`, expected one of `a`, `b`"). A key whose own table is
accepted is a section and is walked in turn; `[[key]]` tables (arrays of tables) likewise. A
table that takes any key (a map such as [health.xid_overrides]) has no fixed keys to list.

The packaged file must name each key, set (`key = ...`) or commented (`# key = ...`), under its
table's header (set or commented, `[a.b]` / `# [a.b]` / `[[a.b]]` / `# [[a.b]]`); and every key
it names, set or commented, must be one the agent accepts. Exit 1 with the list of differences.
"""

import os
import re
import subprocess
import sys
import tempfile

EXPECTED = re.compile(r"unknown field `[^`]*`, expected (?:one of )?(.*)$")
PROBE = "zz_probe_key"


def probe(agent, text):
    """check-config's one-line answer for a file holding `text`."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([agent, "check-config", path], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(path)
    return r.returncode, (r.stderr.strip().splitlines() or [""])[-1]


def keys_of(agent, header):
    """The keys the table at `header` (e.g. "[server]" or "[[a.b]]") accepts, or None."""
    code, line = probe(agent, f"{header}\n{PROBE} = 1\n")
    if code == 0:
        return None  # any key goes: a map
    m = EXPECTED.search(line)
    if not m:
        return None
    return re.findall(r"`([^`]+)`", m.group(1))


def walk(agent, path, header, out):
    """Record every key below the table at `path`; recurse into sub-tables."""
    keys = keys_of(agent, header)
    if keys is None:
        return
    for key in keys:
        sub = path + [key]
        name = ".".join(sub)
        out.add(name)
        # A table? Then `[a.key]` with an unknown key inside names its keys.
        for sub_path, sub_header in ((sub, f"[{name}]"), (sub, f"[[{name}]]"),
                                     (sub + ["*"], f"[[{name}.{PROBE}]]")):
            # The last: a map whose values are arrays of tables ([[mig.layouts.NAME]]).
            if keys_of(agent, sub_header) is not None:
                out.add(".".join(sub_path))
                walk(agent, sub_path, sub_header, out)
                break


def packaged_keys(path):
    """Every key the file names, set or commented, as dotted paths."""
    names = set()
    table = []
    header = re.compile(r"^#?\s*\[\[?\s*([A-Za-z0-9_.\-\"]+)\s*\]\]?\s*(#.*)?$")
    key = re.compile(r"^#?\s*([A-Za-z0-9_\-]+)\s*=")
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        m = header.match(line)
        if m:
            table = [p.strip('"') for p in m.group(1).split(".")]
            for n in range(1, len(table) + 1):
                names.add(".".join(table[:n]))
            continue
        m = key.match(line)
        if m:
            names.add(".".join(table + [m.group(1)]))
    return names


def main():
    agent, config = sys.argv[1], sys.argv[2]
    accepted = set()
    top = keys_of(agent, "")
    if not top:
        sys.exit(f"check_config_keys: {agent} check-config did not list the top-level tables")
    for section in top:
        accepted.add(section)
        walk(agent, [section], f"[{section}]", accepted)
    # A top-level key is a table header in the file, not a `key =` line.
    tables = set(top)
    shown = packaged_keys(config)
    # Below a table that takes any key (a map), the file's keys are examples, not schema keys.
    maps = {k for k in accepted if probe(agent, f"[{k}]\n{PROBE} = 1\n")[0] == 0}
    def matches(key, pattern):
        a, b = key.split("."), pattern.split(".")
        return len(a) == len(b) and all(y in ("*", x) for x, y in zip(a, b))
    missing = sorted(k for k in accepted - tables - shown
                     if not any(matches(s, k) for s in shown))
    unknown = sorted(k for k in shown - accepted
                     if not any(k.startswith(m + ".") for m in maps)
                     and not any(matches(k, a) for a in accepted))
    print(f"check_config_keys: the agent accepts {len(accepted)} keys and tables; "
          f"{config} names {len(shown)}")
    if missing or unknown:
        for k in missing:
            print(f"  missing from {config}: {k}")
        for k in unknown:
            print(f"  not a key the agent accepts: {k}")
        sys.exit(1)
    print("check_config_keys: every key is shown, and every key shown is accepted")


if __name__ == "__main__":
    main()

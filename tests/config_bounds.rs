//! The configuration's size is bounded as a whole: a file and its drop-ins together hold at
//! most 1 MiB, and no table or array more than 4096 entries, so that `check-config` and the
//! daemon's start stay within the unit's `MemoryMax=128M` whatever `config.d` holds.
//!
//! One test in this binary: the peak memory is read as the largest of this process's waited
//! children (`getrusage(RUSAGE_CHILDREN)`), which only this test starts.

mod common;

use std::path::Path;
use std::process::Command;

use common::bin;

/// The unit's `MemoryMax`, the bound the peak must stay under.
const MEMORY_MAX_KIB: i64 = 128 * 1024;

/// `[[mig.layouts.NAME]]` tables with names unique to `tag`, as many as fit in `bytes`.
fn layouts(tag: &str, bytes: usize) -> String {
    let mut out = String::new();
    for i in 0.. {
        let one = format!("[[mig.layouts.{tag}-{i}]]\ndevices = \"all\"\nmig-enabled = false\n");
        if out.len() + one.len() > bytes {
            break;
        }
        out.push_str(&one);
    }
    out
}

fn check_config(file: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .arg("check-config")
        .arg(file)
        .output()
        .expect("check-config");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn peak_kib() -> i64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage")
        .max_rss()
}

#[test]
fn drop_ins_past_the_merged_total_or_the_entries_limit_are_refused_within_memory_max() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[poller]\ninterval = \"1s\"\n").expect("config");
    let d = dir.path().join("config.d");
    std::fs::create_dir(&d).expect("config.d");

    // A small configuration: valid, and check-config says its size and the limit.
    std::fs::write(d.join("10-small.toml"), layouts("small", 2_000)).expect("drop-in");
    let (rc, out, err) = check_config(&config);
    assert_eq!(rc, Some(0), "{err}");
    let total = std::fs::metadata(&config).expect("size").len()
        + std::fs::metadata(d.join("10-small.toml"))
            .expect("size")
            .len();
    assert!(
        out.contains(&format!(
            "size: {total} bytes, the file and its drop-ins together (limit 1048576 bytes)"
        )),
        "{out}"
    );

    // Four drop-ins of distinct layouts, 1 MiB less a little together: within the total, but
    // their merged `mig.layouts` has more than 4096 entries.
    for i in 0..4 {
        std::fs::write(
            d.join(format!("20-{i}.toml")),
            layouts(&format!("q{i}"), 255_000),
        )
        .expect("drop-in");
    }
    let (rc, _, err) = check_config(&config);
    assert_eq!(rc, Some(2), "{err}");
    assert!(
        err.contains("'mig.layouts' has") && err.contains("over the limit of 4096 entries"),
        "{err}"
    );
    let peak = peak_kib();
    assert!(peak < MEMORY_MAX_KIB, "peak {peak} KiB");

    // 64 drop-ins just under the per-file limit (64 MB of distinct layouts): refused at once
    // from their sizes, naming the limit, without reading them.
    std::fs::remove_dir_all(&d).expect("rm config.d");
    std::fs::create_dir(&d).expect("config.d");
    for i in 0..64 {
        std::fs::write(
            d.join(format!("30-{i:02}.toml")),
            layouts(&format!("big{i}"), 1_000_000),
        )
        .expect("drop-in");
    }
    let (rc, _, err) = check_config(&config);
    assert_eq!(rc, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}: cannot read: the configuration file and its drop-ins hold",
            d.display()
        )) && err.contains("over the limit of 1048576 bytes for their merged total"),
        "{err}"
    );
    let peak = peak_kib();
    eprintln!("check-config peak: {peak} KiB");
    assert!(peak < MEMORY_MAX_KIB, "peak {peak} KiB");
}

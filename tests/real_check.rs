//! The real-hardware check's own unit tests (Python, `benches/real-check/test_*.py`), run here
//! so that `cargo test` covers them: side_by_side.py must compare nvidia-smi's clock columns
//! under both spellings (driver 580's `clocks.current.sm`, older `clocks.sm`).

use std::process::Command;

#[test]
fn side_by_side_matches_both_nvidia_smi_column_spellings() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/real-check");
    let out = Command::new("python3")
        .args(["-m", "unittest", "test_side_by_side.py"])
        .current_dir(dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (apt-get install python3)");
    assert!(
        out.status.success(),
        "python3 -m unittest test_side_by_side.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

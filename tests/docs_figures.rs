//! The series figures README.md and docs/metrics.md print are the agent's: each is measured
//! here on the node it names and compared with the number in the text, so that a change to the
//! page that moves a figure fails until the docs say the new one.
//!
//! Counted as docs/metrics.md says: series with a `gpu` label and no `pid` label per GPU; per
//! MIG instance, series with `GPU_I_ID` or `gpu_instance`; per NVLink GPU, the NVLink, fabric
//! and topology series. The demo's node has NVLink; `dgx-h100.toml` is the same node without. Must not read a figure from anywhere but the docs' text.

mod common;

use std::time::Duration;

use common::{is_nvlink_series, scenario, wait_for, Agent, Metrics};

fn read(path: &str) -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + path)
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The first number in `text` after `marker` (digits and one point).
fn number_after(text: &str, marker: &str) -> f64 {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("the docs no longer say {marker:?}"));
    let rest = &text[at + marker.len()..];
    let start = rest
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or_else(|| panic!("no number after {marker:?}"));
    let digits: String = rest[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits
        .trim_end_matches('.')
        .parse()
        .unwrap_or_else(|e| panic!("{digits:?} after {marker:?}: {e}"))
}

fn per_gpu(m: &Metrics, gpus: f64) -> f64 {
    let n = m
        .samples
        .iter()
        .filter(|s| s.labels.contains_key("gpu") && !s.labels.contains_key("pid"))
        .count();
    n as f64 / gpus
}

/// `gpu-steward demo` (8×H100 with NVLink, no MIG) with `config`, once GPM has two samples and
/// field 449 (a rate) its second poll.
fn demo_page(config: &str, gpm_name: &str) -> Metrics {
    let agent = Agent::with_scenario("").demo().config(config).start();
    demo_page_of(&agent, gpm_name, true)
}

fn demo_page_of(agent: &Agent, gpm_name: &str, nvlink: bool) -> Metrics {
    wait_for("GPM fields on every GPU", Duration::from_secs(15), || {
        let m = agent.metrics();
        // Field 449 in 4.8's name, 1648 in 4.9's.
        let bandwidth = m.find("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", &[]).len()
            + m.find("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", &[])
                .len();
        let ready = match nvlink {
            true => bandwidth >= 8,
            false => bandwidth == 0,
        };
        (m.find(gpm_name, &[]).len() >= 8 && ready).then_some(m)
    })
}

#[test]
fn the_series_figures_in_the_docs_are_the_agents() {
    let docs = read("docs/metrics.md");
    let readme = read("README.md");
    let lean_page = demo_page("", "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    let lean = per_gpu(&lean_page, 8.0);
    // The same GPUs without NVLink (dgx-h100.toml: a VM with the GPUs passed through, or a
    // PCIe board): the budget's figure.
    let dir = tempfile::tempdir().expect("tempdir");
    let dgx = dir.path().join("dgx-h100.toml");
    std::fs::write(&dgx, scenario("dgx-h100.toml")).expect("write the scenario");
    let plain = Agent::with_scenario("")
        .demo()
        .arg("--scenario")
        .arg(&dgx.display().to_string())
        .start();
    let lean_plain = per_gpu(
        &demo_page_of(&plain, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", false),
        8.0,
    );
    drop(plain);
    // What an NVLink GPU adds on the lean page, and nothing else differs.
    let nvlink = lean_page
        .samples
        .iter()
        .filter(|s| s.labels.contains_key("gpu") && !s.labels.contains_key("pid"))
        .filter(|s| is_nvlink_series(&s.name))
        .count() as f64
        / 8.0;
    eprintln!("lean per GPU: {lean} on the demo, {lean_plain} without NVLink, NVLink {nvlink}");
    assert_eq!(lean, lean_plain + nvlink);
    // All in: every series without a `pid` label, per GPU, and the node-level ones among them.
    let all_in = lean_page
        .samples
        .iter()
        .filter(|s| !s.labels.contains_key("pid"))
        .count() as f64
        / 8.0;
    let node_level = (all_in - lean) * 8.0;
    let lean49 = per_gpu(
        &demo_page(
            "[metrics]\ndcgm_names = \"4.9\"\n",
            "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        ),
        8.0,
    );
    let both = per_gpu(
        &demo_page(
            "[metrics]\ndcgm_names = \"both\"\n",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ),
        8.0,
    );
    let full = per_gpu(
        &demo_page(
            "[metrics]\nprofile = \"full\"\n",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ),
        8.0,
    );
    let full_both = per_gpu(
        &demo_page(
            "[metrics]\nprofile = \"full\"\ndcgm_names = \"both\"\n",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ),
        8.0,
    );
    eprintln!(
        "per GPU: lean {lean}, lean 4.9 {lean49}, both {both}, full {full}, full both {full_both}"
    );
    assert_eq!(lean, lean49, "the two name sets cost the same");
    assert_eq!(number_after(&docs, "| lean, 4.8 or 4.9 |"), lean);
    assert_eq!(number_after(&docs, "(without NVLink "), lean_plain);
    assert_eq!(number_after(&docs, "| lean, both |"), both);
    assert_eq!(number_after(&docs, "| full, 4.8 |"), full);
    assert_eq!(number_after(&docs, "(both: "), full_both);
    eprintln!("all in {all_in}, node-level {node_level}");
    assert_eq!(number_after(&docs, "the lean demo page serves "), all_in);
    assert_eq!(number_after(&docs, "per GPU: the "), lean);
    assert_eq!(number_after(&docs, " above and "), node_level);
    assert_eq!(number_after(&docs, "the lean page is at "), lean_plain);
    assert_eq!(
        number_after(&readme, "default **lean** profile serves each"),
        lean_plain
    );
    assert_eq!(number_after(&readme, "an HGX board, serves "), lean);
    assert_eq!(number_after(&docs, "Cost per GPU with NVLink: **"), nvlink);
    assert_eq!(number_after(&readme, "an NVLink GPU adds"), nvlink);

    // A MIG instance (H100 with four instances, lean): the docs' per-instance figure.
    let mig = Agent::with_scenario(
        "version = 1\n[driver]\nversion = \"580.95.05\"\ncuda_version = 13000\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
         mig_devices = [\"3g.40gb\", \"2g.20gb\", \"1g.10gb\", \"1g.10gb\"]\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n",
    )
    .config("[metrics]\nprofile = \"lean\"\n")
    .start();
    let m = wait_for("per-instance GPM series", Duration::from_secs(15), || {
        let m = mig.metrics();
        (m.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[("GPU_I_ID", "1")])
            .len()
            == 1)
            .then_some(m)
    });
    let per_instance = m
        .samples
        .iter()
        .filter(|s| {
            (s.labels.contains_key("GPU_I_ID") || s.labels.contains_key("gpu_instance"))
                && !s.labels.contains_key("pid")
        })
        .count() as f64
        / 4.0;
    let row = docs
        .find("| lean, 4.8 or 4.9 |")
        .map(|at| &docs[at..])
        .unwrap_or_default();
    let cells: Vec<&str> = row.lines().next().unwrap_or_default().split('|').collect();
    let documented: f64 = cells
        .get(3)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(f64::NAN);
    assert_eq!(documented, per_instance, "per MIG instance");
}

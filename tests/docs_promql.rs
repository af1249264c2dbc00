//! Every PromQL expression the docs recommend (each ```` ```promql ```` block of `docs/*.md` and
//! README.md, one expression per run of lines between `#` comments) is run against a real
//! Prometheus scraping an agent on the default page (lean profile, dcgm-exporter 4.8 names):
//! each must evaluate, and must answer what the node implies; the XID alert must see the first
//! XID, which the default page publishes at 1, not 0.

mod common;
mod e2e_support;

use std::path::Path;
use std::time::Duration;

use e2e_support::{wait_for, Prometheus};

/// The expressions of the promql blocks of one page.
fn expressions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut current = String::new();
    let flush = |current: &mut String, out: &mut Vec<String>| {
        let e = current.split_whitespace().collect::<Vec<_>>().join(" ");
        if !e.is_empty() {
            out.push(e);
        }
        current.clear();
    };
    for line in text.lines() {
        match (in_block, line.trim_start()) {
            (false, "```promql") => in_block = true,
            (false, _) => {}
            (true, "```") => {
                flush(&mut current, &mut out);
                in_block = false;
            }
            (true, l) if l.starts_with('#') || l.is_empty() => flush(&mut current, &mut out),
            (true, l) => {
                current.push(' ');
                current.push_str(l);
            }
        }
    }
    out
}

fn all_expressions() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.push(root.join("README.md"));
    pages.sort();
    let mut out = Vec::new();
    for p in pages {
        let text = std::fs::read_to_string(&p).expect("read a page");
        let name = p.file_name().expect("name").to_string_lossy().into_owned();
        out.extend(expressions(&text).into_iter().map(|e| (name.clone(), e)));
    }
    out
}

/// What an expression must answer on the test's node: series (with data) or none, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Data,
    /// Empty on this node, for the reason given.
    Empty(&'static str),
}

/// Every documented expression with what it answers here; one the table does not know fails,
/// so a new one gets its expectation when it is written.
fn want(expr: &str) -> Option<Want> {
    const NO_PODS: &str = "no pods on a node without the kubelet: owner_kind=\"pod\" is absent";
    if expr.contains("gpu_steward_xid_errors_total") {
        // Checked apart, before and after the XID.
        return Some(Want::Empty("no XID yet"));
    }
    if expr.contains("owner_kind=\"pod\"") {
        return Some(Want::Empty(NO_PODS));
    }
    if expr.contains("owner_kind!=\"pod\"")
        || expr.contains("gpu_steward_gpu_idle_held_seconds_total")
    {
        return Some(Want::Data);
    }
    None
}

fn rows(prom: &Prometheus, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    prom.query(expr)?
        .as_array()
        .cloned()
        .ok_or_else(|| format!("not a vector: {expr}"))
}

#[test]
fn the_expressions_are_found_in_the_blocks() {
    let text = "a\n```promql\n# one\nsum(x)\n  / 2\n# two\ny\n```\n`z`\n";
    assert_eq!(expressions(text), vec!["sum(x) / 2", "y"]);
}

#[test]
fn every_documented_promql_expression_answers_on_the_default_page() {
    let exprs = all_expressions();
    assert!(
        exprs
            .iter()
            .any(|(_, e)| e.contains("gpu_steward_xid_errors_total")),
        "the XID alert advice is a promql block: {exprs:#?}"
    );
    let unknown: Vec<_> = exprs.iter().filter(|(_, e)| want(e).is_none()).collect();
    assert!(
        unknown.is_empty(),
        "expressions with no expectation: {unknown:#?}"
    );

    let scenario = common::scenario("dgx-h100.toml");
    let agent = common::Agent::with_scenario(&scenario)
        .interval("500ms")
        .config("[metrics]\nprofile = \"lean\"\n")
        .start();
    let target = format!("127.0.0.1:{}", agent.port);
    let prom = Prometheus::start(std::slice::from_ref(&target), "groups: []\n");
    wait_for("10 scrapes", Duration::from_secs(60), || {
        let r = prom
            .query("count_over_time(gpu_steward_build_info[1m]) >= 10")
            .ok()?;
        (!r.as_array()?.is_empty()).then_some(())
    });
    let mut failures = Vec::new();
    for (page, e) in &exprs {
        match (want(e), rows(&prom, e)) {
            (_, Err(err)) => failures.push(format!("{page}: {e}: {err}")),
            (Some(Want::Data), Ok(r)) if r.is_empty() => {
                failures.push(format!("{page}: {e}: no data"));
            }
            (Some(Want::Empty(why)), Ok(r)) if !r.is_empty() => {
                failures.push(format!("{page}: {e}: wanted none ({why}), got {r:?}"));
            }
            _ => {}
        }
    }

    // The first critical XID arrives on GPU 0: every documented XID alert sees it at once.
    let second = scenario
        .match_indices("[[gpu]]")
        .nth(1)
        .expect("a second GPU")
        .0;
    let with_xid = format!(
        "{}[[gpu.event]]\nid = 1\nxid = 48\n\n{}",
        &scenario[..second],
        &scenario[second..]
    );
    agent.rewrite_scenario(&with_xid);
    wait_for("the XID in Prometheus", Duration::from_secs(30), || {
        let r = prom
            .query("gpu_steward_xid_errors_total{xid=\"48\"}")
            .ok()?;
        (!r.as_array()?.is_empty()).then_some(())
    });
    for (page, e) in exprs.iter().filter(|(_, e)| e.contains("xid_errors_total")) {
        match rows(&prom, e) {
            Ok(r)
                if r.len() == 1
                    && r[0]["metric"]["gpu"] == "0"
                    && r[0]["metric"]["xid"] == "48" => {}
            other => failures.push(format!(
                "{page}: {e}: wanted GPU 0's XID 48 right after it came, got {other:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// docs/install.md's figures for the alert rules are the files': alerts, recording rules and
/// promtool test cases (`eval_time` entries), counted here.
#[test]
fn the_alert_figures_in_install_md_are_the_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let count = |dir: &str, needle: &str| -> usize {
        std::fs::read_dir(root.join(dir))
            .expect("a directory")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "yml"))
            .map(|p| {
                std::fs::read_to_string(&p)
                    .expect("read")
                    .lines()
                    .filter(|l| l.trim_start().starts_with(needle))
                    .count()
            })
            .sum()
    };
    let (alerts, records) = (count("alerts", "- alert:"), count("alerts", "- record:"));
    let cases = count("alerts/tests", "- eval_time:");
    let doc = std::fs::read_to_string(root.join("docs/install.md")).expect("install.md");
    let figure = format!(
        "{cases} unit test cases (each of the {alerts} alerts firing and not firing, the \
         {records} recording rules' values"
    );
    assert!(
        doc.contains(&figure),
        "docs/install.md should say: {figure}"
    );
}

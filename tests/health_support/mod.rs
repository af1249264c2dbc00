//! The health tests' vocabulary over the shared harness (`tests/common`): start with a scenario
//! and a config, rewrite the scenario, read verdicts and metrics, wait for a condition.

#![allow(dead_code)]

use std::time::Duration;

use crate::common;

pub struct Agent(common::Agent);

impl Agent {
    pub fn start(scenario: &str, config: &str) -> Agent {
        Agent(
            common::Agent::with_scenario(scenario)
                .config(config)
                .start(),
        )
    }

    pub fn rewrite(&self, scenario: &str) {
        self.0.rewrite_scenario(scenario);
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self.0.get(path);
        (r.status, r.text())
    }

    pub fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.0.get(path);
        (r.status, r.json())
    }

    /// Names of the active conditions of GPU `index`, from `/health/gpus`.
    pub fn conditions(&self, index: u32) -> Vec<String> {
        let (_, v) = self.json("/health/gpus");
        v["checks"][format!("gpu:{index}")][0]["conditions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The value of the first sample line starting with `prefix` (name and labels).
    pub fn metric(&self, prefix: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    pub fn wait_for(&self, what: &str, cond: impl Fn(&Agent) -> bool) {
        common::wait_for(what, Duration::from_secs(15), || cond(self).then_some(()));
    }
}

//! The CUDA time-slice length through `nvidia-smi compute-policy`: there is no public NVML
//! function for it (nvml.h API 13 has none; NVIDIA's own DRA driver shells out the same way,
//! NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/sharing.go`).
//!
//! Commands run through [`crate::exec::run`]: argv, no shell, with a timeout. The listing is
//! the table `nvidia-smi compute-policy -l` prints on driver 580 (captured on a real H100,
//! driver 580.159.04):
//!
//! ```text
//! |   0   Timeslice       Default       |
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::config::sharing::Timeslice;
use crate::exec::{self, CommandSpec};

/// Why a command failed, in words for the report.
fn failure(what: &str, out: &exec::RunOutput) -> String {
    let stderr = out.stderr.trim();
    let stdout = out.stdout.trim();
    let detail = if !stderr.is_empty() { stderr } else { stdout };
    let detail: String = detail.chars().take(300).collect();
    if detail.is_empty() {
        format!("{what} {}", out.outcome)
    } else {
        format!("{what} {}: {detail}", out.outcome)
    }
}

/// The argv that sets GPU `uuid`'s time-slice: the form NVIDIA's DRA driver runs
/// (k8s-dra-driver-gpu `setTimeSlice`: `compute-policy -i <uuid> --set-timeslice <n>`).
pub fn set_argv(nvidia_smi: &Path, uuid: &str, t: Timeslice) -> Vec<String> {
    vec![
        nvidia_smi.display().to_string(),
        "compute-policy".into(),
        "-i".into(),
        uuid.into(),
        "--set-timeslice".into(),
        t.code().to_string(),
    ]
}

/// The time-slice of every GPU, by index (`nvidia-smi compute-policy -l`).
pub fn observe(nvidia_smi: &Path, timeout: Duration) -> Result<BTreeMap<u32, Timeslice>, String> {
    let spec = CommandSpec {
        name: "nvidia-smi compute-policy -l".into(),
        argv: vec![
            nvidia_smi.display().to_string(),
            "compute-policy".into(),
            "-l".into(),
        ],
        timeout,
    };
    let out = exec::run(&spec, b"", &[]);
    if !out.outcome.success() {
        return Err(failure("'nvidia-smi compute-policy -l'", &out));
    }
    let found = parse_list(&out.stdout);
    if found.is_empty() {
        return Err(format!(
            "'nvidia-smi compute-policy -l' printed no Timeslice row: {}",
            out.stdout.chars().take(200).collect::<String>()
        ));
    }
    Ok(found)
}

/// Sets GPU `uuid`'s time-slice.
pub fn set(nvidia_smi: &Path, timeout: Duration, uuid: &str, t: Timeslice) -> Result<(), String> {
    let spec = CommandSpec {
        name: "nvidia-smi compute-policy --set-timeslice".into(),
        argv: set_argv(nvidia_smi, uuid, t),
        timeout,
    };
    let out = exec::run(&spec, b"", &[]);
    if out.outcome.success() {
        Ok(())
    } else {
        Err(failure("'nvidia-smi compute-policy --set-timeslice'", &out))
    }
}

/// Rows `| <gpu> Timeslice <Value> |` of the listing.
pub fn parse_list(text: &str) -> BTreeMap<u32, Timeslice> {
    text.lines()
        .filter_map(|line| {
            let mut words = line
                .split(|c: char| c.is_whitespace() || c == '|')
                .filter(|w| !w.is_empty());
            let gpu = words.next()?.parse::<u32>().ok()?;
            if !words.next()?.eq_ignore_ascii_case("timeslice") {
                return None;
            }
            let value = Timeslice::parse(&words.next()?.to_ascii_lowercase())?;
            Some((gpu, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_real_h100_listing() {
        let text = "+-------------------------------------+\n\
                    | GPU compute policies:               |\n\
                    | GPU     Name           Value        |\n\
                    |=====================================|\n\
                    |   0   Timeslice       Default       |\n\
                    |   1   Timeslice       Long          |\n\
                    +-------------------------------------+\n";
        let m = parse_list(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&0], Timeslice::Default);
        assert_eq!(m[&1], Timeslice::Long);
        assert!(parse_list("No devices were found\n").is_empty());
    }

    #[test]
    fn the_set_command_is_argv_with_the_numeric_code() {
        assert_eq!(
            set_argv(Path::new("/usr/bin/nvidia-smi"), "GPU-a", Timeslice::Medium),
            [
                "/usr/bin/nvidia-smi",
                "compute-policy",
                "-i",
                "GPU-a",
                "--set-timeslice",
                "2"
            ]
        );
    }
}

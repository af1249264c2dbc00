//! Label names the configuration may choose (`[metrics] hostname_label`, `[kubernetes]
//! pod_label`, `namespace_label`, `container_label`).
//!
//! A chosen name that equals a label the agent already puts on the same series, or another
//! chosen name, would give a series two labels of one name: Prometheus rejects the whole scrape
//! ("duplicate label names"), so every GPU would vanish from monitoring at the next reload. Such
//! names are refused when the file is read, with the position of the offending value.

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// Every label name the agent's families use, on any series.
pub const RESERVED: &[&str] = &[
    // dcgm-exporter compatible family
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "DCGM_FI_DRIVER_VERSION",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "err_code",
    "err_msg",
    "xid",
    "window_size_in_ms",
    // native family
    "uuid",
    "name",
    "serial",
    "pci_device_id",
    "architecture",
    "compute_capability",
    "driver_version",
    "cuda_version",
    "clock",
    "threshold",
    "error",
    "cause",
    "reason",
    "condition",
    "severity",
    // per-process series and Kubernetes info
    "pid",
    "process",
    "user",
    "type",
    "container_id",
    "pod_uid",
    "systemd_unit",
    "slurm_job",
    "gpu_instance",
    "replica",
    // sharing
    "mode",
    "resource",
    "trigger",
    // agent self-metrics
    "source",
    "function",
    "version",
    "revision",
    "result",
];

/// Checks one label name: Prometheus syntax, not reserved by Prometheus (`__`), not one of ours.
/// `empty_ok` for the hostname label, where "" means "leave it out".
pub fn check(s: &str, empty_ok: bool, example: &str) -> Result<(), String> {
    if s.is_empty() {
        return if empty_ok {
            Ok(())
        } else {
            Err(format!("the label name is empty; use e.g. '{example}'"))
        };
    }
    let syntax = s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && !s.starts_with("__");
    if !syntax {
        return Err(format!(
            "invalid label name '{s}'; use letters, digits and '_', e.g. '{example}'"
        ));
    }
    if RESERVED.contains(&s) {
        return Err(format!(
            "label name '{s}' is already used by gpu-steward's own series, which would then \
             carry it twice and Prometheus would reject every scrape; choose another, e.g. \
             '{example}'"
        ));
    }
    Ok(())
}

/// A non-empty label name, with its position kept for the cross-field check.
pub fn label<'de, D: Deserializer<'de>>(d: D) -> Result<Spanned<String>, D::Error> {
    let s = Spanned::<String>::deserialize(d)?;
    check(s.get_ref(), false, "k8s_pod").map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// A label name that may be empty (= leave the label out).
pub fn optional_label<'de, D: Deserializer<'de>>(d: D) -> Result<Spanned<String>, D::Error> {
    let s = Spanned::<String>::deserialize(d)?;
    check(s.get_ref(), true, "hostname").map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// Longest label value the configuration may set (`[metrics] hostname`), in bytes: above any
/// host or Kubernetes node name (253), far below what bloats a page. The value goes on every
/// series: 100 KB of it made a 32 MB page.
pub const MAX_LABEL_VALUE: usize = 256;

/// A label value of at most [`MAX_LABEL_VALUE`] bytes; refused with its position otherwise (a
/// file can be fixed; a truncated value could collide with another node's).
pub fn optional_label_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<String>::deserialize(d)?;
    match &v {
        Some(s) if s.len() > MAX_LABEL_VALUE => Err(serde::de::Error::custom(format!(
            "the label value is {} bytes, over the limit of {MAX_LABEL_VALUE}; use the node's \
             short name",
            s.len()
        ))),
        _ => Ok(v),
    }
}

/// `value` cut to at most [`MAX_LABEL_VALUE`] bytes at a character boundary, and whether it was
/// cut. For values that come from the environment, where there is no file to point at.
pub fn truncate_value(value: String) -> (String, bool) {
    if value.len() <= MAX_LABEL_VALUE {
        return (value, false);
    }
    let mut end = MAX_LABEL_VALUE;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    (value[..end].to_string(), true)
}

/// The first pair of configured names that are equal: the span of the one written in the file
/// (the later one if both are) and the message. A default has an empty span.
pub fn first_duplicate(
    names: &[(&str, &Spanned<String>)],
) -> Option<(std::ops::Range<usize>, String)> {
    for (i, (key, value)) in names.iter().enumerate() {
        if value.get_ref().is_empty() {
            continue;
        }
        let Some((other_key, other)) = names[..i]
            .iter()
            .find(|(_, v)| v.get_ref() == value.get_ref())
        else {
            continue;
        };
        let written = |v: &Spanned<String>| !v.span().is_empty();
        let ((culprit_key, culprit), (peer_key, peer)) = if written(value) || !written(other) {
            ((key, value), (other_key, other))
        } else {
            ((other_key, other), (key, value))
        };
        let peer_note = if written(peer) { "" } else { " (its default)" };
        return Some((
            culprit.span(),
            format!(
                "{culprit_key} '{}' is the same as {peer_key}{peer_note}; a series would carry \
                 the label twice and Prometheus would reject every scrape: give each its own name",
                culprit.get_ref()
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_and_malformed_names_are_refused() {
        assert!(check("k8s_pod", false, "x").is_ok());
        assert!(check("", true, "x").is_ok());
        assert!(check("", false, "x").is_err());
        for bad in ["gpu", "uuid", "UUID", "process", "pod_uid", "xid"] {
            let e = check(bad, false, "x").expect_err(bad);
            assert!(e.contains("already used"), "{e}");
        }
        for bad in ["host-name", "1x", "__x"] {
            assert!(check(bad, true, "x").is_err(), "{bad}");
        }
    }

    #[test]
    fn duplicates_point_at_the_second_name() {
        let a = Spanned::new(10..15, "pod".to_string());
        let b = Spanned::new(30..35, "pod".to_string());
        let c = Spanned::new(50..52, String::new());
        let d = Spanned::new(60..62, String::new());
        let (span, msg) =
            first_duplicate(&[("pod_label", &a), ("container_label", &b)]).expect("duplicate");
        assert_eq!(span, 30..35);
        assert!(
            msg.starts_with("container_label 'pod' is the same as pod_label"),
            "{msg}"
        );
        assert_eq!(
            first_duplicate(&[("a", &c), ("b", &d)]),
            None,
            "empty names never clash"
        );
    }
}

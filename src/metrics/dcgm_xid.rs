//! XIDs the way dcgm-exporter exposes them: the last XID (`DCGM_FI_DEV_XID_ERRORS` in 4.8,
//! `DCGM_FI_DEV_XID_ERROR` in 4.9, with the catalog's mnemonic and description as `err_code` and
//! `err_msg`) and `DCGM_EXP_XID_ERRORS_COUNT` (XIDs within a sliding window, `window_size_in_ms`
//! default 300000 like dcgm-exporter's `--xid-count-window-size`; an exporter-owned name that
//! 4.9 did not rename).

use super::dcgm_sets::{ByName, Labelled, NameSet};
use super::Families;
use crate::health::{catalog, NodeHealth};

/// `sets`: the GPUs dcgm.rs renders, with each chosen name set's labels in its order.
pub(super) fn render(sets: &[(NameSet, Vec<Labelled>)], health: &NodeHealth, out: &mut Families) {
    let mut last = ByName::default();
    let mut count = ByName::default();
    let window = health.xid_count_window_ms.to_string();
    for (set, gpus) in sets {
        let name = match set {
            NameSet::V48 => "DCGM_FI_DEV_XID_ERRORS",
            NameSet::V49 => "DCGM_FI_DEV_XID_ERROR",
        };
        let last = last.get(name, "Value of the last XID error encountered.", false);
        let count = count.get(
            "DCGM_EXP_XID_ERRORS_COUNT",
            "Count of XID Errors within user-specified time window (see xid-count-window-size flag).",
            false,
        );
        for (labels, g) in gpus {
            // No XID yet: 0 as dcgm-exporter reports it, with empty err_code/err_msg (= absent).
            let (code, msg) = g.last_xid.map_or(("", ""), catalog::describe);
            let mut with_err = labels.clone();
            with_err.push(("err_code", code.to_string()));
            with_err.push(("err_msg", msg.to_string()));
            last.add(&with_err, g.last_xid.unwrap_or(0) as f64);
            let Some(h) = health.gpu(g.index) else {
                continue;
            };
            for (xid, n) in &h.xid_window_counts {
                let mut l = labels.clone();
                l.push(("xid", xid.to_string()));
                l.push(("window_size_in_ms", window.clone()));
                count.add(&l, *n as f64);
            }
        }
    }
    last.push_into(out);
    count.push_into(out);
}

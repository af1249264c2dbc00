//! XIDs the way dcgm-exporter exposes them: `DCGM_FI_DEV_XID_ERRORS` (the last XID, with the
//! catalog's mnemonic and description as `err_code` and `err_msg`) and
//! `DCGM_EXP_XID_ERRORS_COUNT` (XIDs within a sliding window, `window_size_in_ms` default
//! 300000 like dcgm-exporter's `--xid-count-window-size`).

use super::{Families, Family};
use crate::health::{catalog, NodeHealth};
use crate::snapshot::GpuSnapshot;

/// `gpus`: the GPUs dcgm.rs renders, with its label set in its order.
pub(super) fn render(
    gpus: &[(Vec<(&str, String)>, &GpuSnapshot)],
    health: &NodeHealth,
    out: &mut Families,
) {
    let mut last = Family::gauge(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
    );
    let mut count = Family::gauge(
        "DCGM_EXP_XID_ERRORS_COUNT",
        "Count of XID Errors within user-specified time window (see xid-count-window-size flag).",
    );
    let window = health.xid_count_window_ms.to_string();
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
    out.push(last);
    out.push(count);
}

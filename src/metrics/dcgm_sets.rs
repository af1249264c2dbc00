//! What the parts of the dcgm-exporter compatible family share: its two name sets, each GPU's
//! label set in dcgm-exporter's order, and one family per distinct name.
//!
//! Apart from `dcgm.rs` so that the parts it calls (`dcgm_xid`, `gpm`, `nvlink`) import these
//! and not the file that calls them. Must not: render a field.

use super::{Families, Family, RenderConfig};
use crate::config::DcgmNames;
use crate::snapshot::{GpuSnapshot, GpuStatus, Snapshot};

/// One of dcgm-exporter's two name sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NameSet {
    V48,
    V49,
}

impl NameSet {
    /// The sets `names` asks for, 4.8 first.
    pub(super) fn chosen(names: DcgmNames) -> impl Iterator<Item = NameSet> {
        [
            names.v48().then_some(NameSet::V48),
            names.v49().then_some(NameSet::V49),
        ]
        .into_iter()
        .flatten()
    }

    /// The name of the driver-version label.
    fn driver_label(self) -> &'static str {
        match self {
            NameSet::V48 => "DCGM_FI_DRIVER_VERSION",
            NameSet::V49 => "DCGM_FI_SYSTEM_DRIVER_VERSION",
        }
    }
}

/// A GPU this family renders, with the labels of one name set in dcgm-exporter's order.
pub(super) type Labelled<'a> = (Vec<(&'a str, String)>, &'a GpuSnapshot);

pub(super) fn labelled<'a>(
    snapshot: &'a Snapshot,
    config: &'a RenderConfig,
    set: NameSet,
) -> Vec<Labelled<'a>> {
    let driver = snapshot
        .driver
        .as_ref()
        .map(|d| d.driver_version.as_str())
        .unwrap_or("");
    // 4.9 renamed `Hostname` to `hostname` (4.8.3 already had); `""` leaves it out in both.
    let host_label = match set {
        _ if config.hostname_label.is_empty() => None,
        NameSet::V48 => Some(config.hostname_label.as_str()),
        NameSet::V49 => Some("hostname"),
    };
    snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .filter_map(|g| {
            let id = g.identity.as_ref().filter(|id| id.labels_known())?;
            let mut labels = vec![
                ("gpu", g.index.to_string()),
                ("UUID", id.uuid.clone()),
                ("pci_bus_id", id.pci_bus_id.clone()),
                // /dev/nvidiaN is named after the minor number.
                (
                    "device",
                    format!("nvidia{}", id.minor_number.unwrap_or(g.index)),
                ),
                ("modelName", id.name.clone()),
            ];
            if let Some(name) = host_label {
                labels.push((name, config.hostname.clone()));
            }
            labels.push((set.driver_label(), driver.to_string()));
            // dcgm-exporter's --kubernetes attributes, for a GPU allocated to one container.
            if let (Some(k), [pod]) = (&snapshot.kubernetes, g.reading.pods.as_slice()) {
                labels.push((k.labels.container.as_str(), pod.container.clone()));
                labels.push((k.labels.namespace.as_str(), pod.namespace.clone()));
                labels.push((k.labels.pod.as_str(), pod.pod.clone()));
            }
            Some((labels, g))
        })
        .collect()
}

/// The families of one field across the chosen name sets: one per distinct name, so that a name
/// both sets share gets one `# TYPE` line (a second one would make Prometheus reject the page).
#[derive(Default)]
pub(super) struct ByName(Vec<Family>);

impl ByName {
    pub(super) fn get(
        &mut self,
        name: &'static str,
        help: &'static str,
        counter: bool,
    ) -> &mut Family {
        let i = match self.0.iter().position(|f| f.name() == name) {
            Some(i) => i,
            None => {
                self.0.push(Family::new(name, help, counter));
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    pub(super) fn push_into(self, out: &mut Families) {
        for f in self.0 {
            out.push(f);
        }
    }
}

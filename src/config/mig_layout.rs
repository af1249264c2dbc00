//! Named MIG layouts with the meaning of mig-parted's `mig-configs` (NVIDIA/mig-parted
//! `api/spec/v1/spec.go`): each layout is a list of entries; an entry applies to the GPUs its
//! `device-filter` (PCI device ids, optional) **and** `devices` (`all` or enumeration indices)
//! select, and says whether MIG is on (`mig-enabled`) and which instances to have
//! (`mig-devices`: profile → count). When several entries of a layout select a GPU the last one
//! wins, as when mig-parted applies them in order. GPUs no entry selects are left alone.
//!
//! The same entry type reads the `[mig.layouts]` tables of the TOML config and mig-parted's
//! YAML (`yaml.rs`); validation happens while deserialising, so errors carry positions.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::snapshot::mig::MigGpu;

/// One entry of a layout.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawEntry")]
pub struct LayoutEntry {
    /// PCI `device << 16 | vendor` ids (with an optional subsystem), empty = any GPU.
    pub device_filter: Vec<DeviceFilter>,
    pub devices: Devices,
    pub mig_enabled: bool,
    /// Profile name → count.
    pub mig_devices: BTreeMap<String, u32>,
}

/// `devices:` — every GPU, or these indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    All,
    Indices(Vec<u32>),
}

/// One `device-filter` item: `0x233010DE`, optionally `:0x16C110DE` (subsystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFilter {
    pub device: u32,
    pub subsystem: Option<u32>,
}

impl DeviceFilter {
    pub fn parse(s: &str) -> Result<DeviceFilter, String> {
        let hex = |p: &str| {
            p.strip_prefix("0x")
                .or_else(|| p.strip_prefix("0X"))
                .filter(|h| h.len() == 8)
                .and_then(|h| u32::from_str_radix(h, 16).ok())
        };
        let bad = || {
            format!(
                "device filter '{s}' is not a PCI id like '0x233010DE' (device and vendor, \
                 8 hex digits) optionally followed by ':0xSSSSVVVV'"
            )
        };
        let (dev, sub) = match s.split_once(':') {
            Some((d, sub)) => (d, Some(hex(sub).ok_or_else(bad)?)),
            None => (s, None),
        };
        Ok(DeviceFilter {
            device: hex(dev).ok_or_else(bad)?,
            subsystem: sub,
        })
    }
}

impl fmt::Display for DeviceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08X}", self.device)?;
        if let Some(s) = self.subsystem {
            write!(f, ":0x{s:08X}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(rename = "device-filter", default, deserialize_with = "one_or_many")]
    device_filter: Vec<String>,
    devices: RawDevices,
    #[serde(rename = "mig-enabled")]
    mig_enabled: bool,
    #[serde(rename = "mig-devices", default)]
    mig_devices: Option<BTreeMap<String, u32>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawDevices {
    Word(String),
    List(Vec<u32>),
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

impl TryFrom<RawEntry> for LayoutEntry {
    type Error = String;

    fn try_from(raw: RawEntry) -> Result<Self, String> {
        let device_filter = raw
            .device_filter
            .iter()
            .map(|s| DeviceFilter::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        let devices = match raw.devices {
            RawDevices::Word(w) if w == "all" => Devices::All,
            RawDevices::Word(w) => {
                return Err(format!(
                    "devices '{w}' is neither 'all' nor a list of GPU indices like [0, 1]"
                ))
            }
            RawDevices::List(v) if v.is_empty() => {
                return Err("devices is an empty list; use 'all' or GPU indices like [0, 1]".into())
            }
            RawDevices::List(v) => Devices::Indices(v),
        };
        let mig_devices = raw.mig_devices.unwrap_or_default();
        if !raw.mig_enabled && !mig_devices.is_empty() {
            return Err(
                "mig-devices is given but mig-enabled is false; remove mig-devices or \
                        set mig-enabled: true"
                    .into(),
            );
        }
        for name in mig_devices.keys() {
            check_profile_name(name)?;
        }
        Ok(LayoutEntry {
            device_filter,
            devices,
            mig_enabled: raw.mig_enabled,
            mig_devices,
        })
    }
}

/// mig-parted's profile syntax: `[<C>c.]<G>g.<GB>gb[+me|+me.all|+gfx|-me]`.
pub fn check_profile_name(name: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "MIG profile '{name}' is not of the form '[<C>c.]<G>g.<GB>gb[+me|+me.all|+gfx|-me]', \
             e.g. '3g.40gb' or '1g.10gb+me'"
        )
    };
    let base = ["+me.all", "+me", "+gfx", "-me"]
        .iter()
        .find_map(|a| name.strip_suffix(a))
        .unwrap_or(name);
    let parts: Vec<&str> = base.split('.').collect();
    let num = |s: &str, unit: &str| {
        s.strip_suffix(unit)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .is_some()
    };
    let ok = match parts.as_slice() {
        [g, gb] => num(g, "g") && num(gb, "gb"),
        [c, g, gb] => num(c, "c") && num(g, "g") && num(gb, "gb"),
        _ => false,
    };
    ok.then_some(()).ok_or_else(bad)
}

impl LayoutEntry {
    /// Whether this entry selects `gpu`.
    pub fn selects(&self, gpu: &MigGpu) -> bool {
        let by_filter = self.device_filter.is_empty()
            || self.device_filter.iter().any(|f| {
                f.device == gpu.pci_device_id
                    && f.subsystem.is_none_or(|s| s == gpu.pci_subsystem_id)
            });
        let by_index = match &self.devices {
            Devices::All => true,
            Devices::Indices(v) => v.contains(&gpu.index),
        };
        by_filter && by_index
    }
}

/// A layout: its entries.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Layout {
    #[serde(deserialize_with = "non_empty")]
    pub entries: Vec<LayoutEntry>,
}

fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LayoutEntry>, D::Error> {
    let v = Vec::<LayoutEntry>::deserialize(d)?;
    if v.is_empty() {
        return Err(de::Error::custom(
            "a layout needs at least one entry (devices, mig-enabled, mig-devices)",
        ));
    }
    Ok(v)
}

/// What one GPU should look like under a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTarget {
    /// The entry named this GPU by index (`devices: [..]`), not `all`: a GPU without MIG is
    /// then an error instead of skipped (mig-parted's rule).
    pub explicit: bool,
    pub mig_enabled: bool,
    /// Profile name → count.
    pub mig_devices: BTreeMap<String, u32>,
}

impl Layout {
    /// The target of `gpu`: the last entry that selects it; `None` = leave it alone.
    pub fn target_for(&self, gpu: &MigGpu) -> Option<GpuTarget> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.selects(gpu))
            .map(|e| GpuTarget {
                explicit: matches!(e.devices, Devices::Indices(_)),
                mig_enabled: e.mig_enabled,
                mig_devices: e.mig_devices.clone(),
            })
    }
}

/// Named layouts.
pub type Layouts = BTreeMap<String, Layout>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names() {
        for ok in [
            "1g.10gb",
            "1g.10gb+me",
            "1c.3g.40gb",
            "7g.141gb",
            "1g.24gb+me.all",
            "2g.48gb-me",
        ] {
            assert!(check_profile_name(ok).is_ok(), "{ok}");
        }
        for bad in ["1g", "g.10gb", "1g.10", "1g.10gb+x", "3g.40gb.1", ""] {
            assert!(check_profile_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters() {
        let f = DeviceFilter::parse("0x233010DE").expect("valid");
        assert_eq!(f.device, 0x2330_10DE);
        let f = DeviceFilter::parse("0x20B010DE:0x134F10DE").expect("with subsystem");
        assert_eq!(f.subsystem, Some(0x134F_10DE));
        assert!(DeviceFilter::parse("2330").is_err());
    }
}

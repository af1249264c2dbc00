//! Values that TOML and YAML spell alike: a GPU (index or UUID), a resource's `devices`, and
//! memory sizes, each parsed with an error that says what is accepted.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{Devices, GpuSelector};

/// Parses a memory size: `"10GiB"`, `"512MiB"`, `"20Gi"`, `"1.5GB"`, or a plain number of
/// bytes.
pub fn parse_memory_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let factor: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" | "Ki" => 1024.0,
        "MiB" | "Mi" => 1024.0 * 1024.0,
        "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "k" | "K" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        _ => f64::NAN,
    };
    match num.parse::<f64>() {
        Ok(v) if factor.is_finite() && v > 0.0 && v * factor < 1e15 => Ok((v * factor) as u64),
        _ => Err(format!(
            "invalid memory size '{s}'; write it like \"10GiB\", \"512MiB\" or \"20Gi\""
        )),
    }
}

/// A GPU index or UUID, in TOML or YAML.
#[derive(Debug)]
pub struct SelectorSpec(pub GpuSelector);

impl<'de> Deserialize<'de> for SelectorSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SelectorVisitor)
    }
}

struct SelectorVisitor;

impl<'de> Visitor<'de> for SelectorVisitor {
    type Value = SelectorSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a GPU index or a UUID")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<SelectorSpec, E> {
        u32::try_from(v)
            .map(|i| SelectorSpec(GpuSelector::Index(i)))
            .map_err(|_| E::custom(format!("GPU index {v} is out of range")))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<SelectorSpec, E> {
        u64::try_from(v)
            .map_err(|_| E::custom(format!("GPU index {v} is negative; indices start at 0")))
            .and_then(|v| self.visit_u64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SelectorSpec, E> {
        GpuSelector::parse(v).map(SelectorSpec).map_err(E::custom)
    }
}

/// `devices`: `"all"`, a count, or a list of GPU indices and UUIDs.
#[derive(Debug)]
pub struct DevicesSpec(pub Devices);

impl<'de> Deserialize<'de> for DevicesSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DevicesVisitor)
    }
}

struct DevicesVisitor;

const DEVICES_HINT: &str =
    "use \"all\", a number of GPUs, or a list of GPU indices and UUIDs like [0, \"GPU-...\"]";

impl<'de> Visitor<'de> for DevicesVisitor {
    type Value = DevicesSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "\"all\", a count, or a list of GPUs")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<DevicesSpec, E> {
        if v == "all" {
            Ok(DevicesSpec(Devices::All))
        } else {
            Err(E::custom(format!("invalid devices '{v}'; {DEVICES_HINT}")))
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<DevicesSpec, E> {
        match u32::try_from(v) {
            Ok(n) if n > 0 => Ok(DevicesSpec(Devices::Count(n))),
            _ => Err(E::custom(format!("invalid devices {v}; {DEVICES_HINT}"))),
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<DevicesSpec, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(format!("invalid devices {v}; {DEVICES_HINT}"))),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DevicesSpec, A::Error> {
        let mut list = Vec::new();
        while let Some(s) = seq.next_element::<SelectorSpec>()? {
            list.push(s.0);
        }
        if list.is_empty() {
            return Err(de::Error::custom(format!(
                "devices is an empty list; {DEVICES_HINT}"
            )));
        }
        Ok(DevicesSpec(Devices::List(list)))
    }
}

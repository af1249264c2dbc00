//! PCI addresses as NVML prints and parses them (`00000000:3B:00.0`).

/// A PCI address; `bus_id()` prints it the way NVML does (`00000000:3B:00.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciAddr {
    /// Accepts the forms nvml.h lists for `nvmlDeviceGetHandleByPciBusId_v2` (hexadecimal):
    /// `domain:bus:device.function`, `domain:bus:device` and `bus:device.function`; any case.
    pub fn parse(s: &str) -> Option<PciAddr> {
        let hex = |p: &str| {
            (!p.is_empty() && p.len() <= 8).then_some(())?;
            u32::from_str_radix(p, 16).ok()
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, rest] => (hex(d)?, hex(b)?, *rest),
            [b, rest] if rest.contains('.') => (0, hex(b)?, *rest),
            _ => return None,
        };
        let (device, function) = match rest.split_once('.') {
            Some((d, f)) => (hex(d)?, hex(f)?),
            None => (hex(rest)?, 0),
        };
        (bus <= 0xFF && device <= 0x1F && function <= 7).then_some(PciAddr {
            domain,
            bus,
            device,
            function,
        })
    }

    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// The 16-byte legacy form (`0000:3B:00.0`) of `nvmlPciInfo_t::busIdLegacy`.
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain & 0xFFFF,
            self.bus,
            self.device,
            self.function
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_forms() {
        let full = PciAddr::parse("00000000:3b:00.0").map(|p| p.bus_id());
        assert_eq!(full.as_deref(), Some("00000000:3B:00.0"));
        assert_eq!(
            PciAddr::parse("0000:3B:00.0"),
            PciAddr::parse("00000000:3B:00.0")
        );
        assert_eq!(
            PciAddr::parse("3B:00.0"),
            PciAddr::parse("00000000:3B:00.0")
        );
        assert_eq!(PciAddr::parse("0:3B:0"), PciAddr::parse("00000000:3B:00.0"));
        assert!(PciAddr::parse("zz:00.0").is_none());
        assert!(PciAddr::parse("3B").is_none());
        let legacy = PciAddr::parse("00000000:3B:00.0").map(|p| p.bus_id_legacy());
        assert_eq!(legacy.as_deref(), Some("0000:3B:00.0"));
    }
}

//! Identity helpers with no simulator state: the stable hash that derives UUIDs and serials,
//! and the check of NVML's GPU UUID form. They sit at the bottom so both the scenario side
//! (`resolve`, `validate`) and the MIG side (`instances`) can use them without importing each
//! other.

/// 64-bit FNV-1a, then a splitmix64 finaliser: stable across Rust versions (unlike
/// `DefaultHasher`), so derived identities never change between builds.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Whether `s` looks like `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits).
pub fn is_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

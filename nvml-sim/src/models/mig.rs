//! MIG GPU-instance profiles as NVML reports them with `nvmlDeviceGetGpuInstanceProfileInfo*`
//! and `nvmlDeviceGetGpuInstancePossiblePlacements_v2`, MIG enabled or not. The geometry (profile
//! index, hardware id, slices, instance count, memory-slice placements) is the same on A100,
//! H100 and H200 (NVIDIA's MIG User Guide; exactly what the real H100 and H200 answered on
//! driver 580.159.04); SM, engine and memory figures differ per model (the guide's tables for
//! the A100s, the captures in `nvml-sim/tests/data/` for H100 and H200).

/// One GPU-instance profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// The `profile` argument of `…GetGpuInstanceProfileInfo[V]` (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub index: u32,
    /// The hardware profile id every other GPU-instance call takes.
    pub id: u32,
    /// Without NVML's `"MIG "` prefix, e.g. `"1g.10gb"`.
    pub name: &'static str,
    pub slices: u32,
    pub instances: u32,
    pub sms: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub memory_mb: u64,
    /// Memory-slice starts of the possible placements, each `placement_size` slices long.
    pub placement_starts: &'static [u32],
    pub placement_size: u32,
}

/// What every MIG-capable model shares for one profile.
struct Geometry {
    index: u32,
    id: u32,
    slices: u32,
    instances: u32,
    starts: &'static [u32],
    size: u32,
}

const ALL_1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
/// 1g (id 19, index 0): seven, one memory slice each.
const G1: Geometry = Geometry {
    index: 0,
    id: 19,
    slices: 1,
    instances: 7,
    starts: ALL_1,
    size: 1,
};
/// 1g+me (id 20, index 7, `1_SLICE_REV1`): one per GPU, at any 1-slice spot.
const G1_ME: Geometry = Geometry {
    index: 7,
    id: 20,
    slices: 1,
    instances: 1,
    starts: ALL_1,
    size: 1,
};
/// 1g with twice the memory (id 15, index 9, `1_SLICE_REV2`).
const G1_2X: Geometry = Geometry {
    index: 9,
    id: 15,
    slices: 1,
    instances: 4,
    starts: &[0, 2, 4, 6],
    size: 2,
};
const G2: Geometry = Geometry {
    index: 1,
    id: 14,
    slices: 2,
    instances: 3,
    starts: &[0, 2, 4],
    size: 2,
};
const G3: Geometry = Geometry {
    index: 2,
    id: 9,
    slices: 3,
    instances: 2,
    starts: &[0, 4],
    size: 4,
};
const G4: Geometry = Geometry {
    index: 3,
    id: 5,
    slices: 4,
    instances: 1,
    starts: &[0],
    size: 4,
};
const G7: Geometry = Geometry {
    index: 4,
    id: 0,
    slices: 7,
    instances: 1,
    starts: &[0],
    size: 8,
};

/// One row: `engines` = [copy engines, decoders, encoders, JPEG, OFA].
const fn gi(
    g: Geometry,
    name: &'static str,
    sms: u32,
    engines: [u32; 5],
    memory_mb: u64,
) -> GiProfile {
    GiProfile {
        index: g.index,
        id: g.id,
        name,
        slices: g.slices,
        instances: g.instances,
        sms,
        copy_engines: engines[0],
        decoders: engines[1],
        encoders: engines[2],
        jpegs: engines[3],
        ofas: engines[4],
        memory_mb,
        placement_starts: g.starts,
        placement_size: g.size,
    }
}

// Rows are in NVML profile-index order (0, 1, 2, 3, 4, 7, 9), as the driver enumerates them.

/// NVIDIA's MIG User Guide, A100 profile table (memory = guide GiB × 1024).
pub static A100_40GB: &[GiProfile] = &[
    gi(G1, "1g.5gb", 14, [1, 0, 0, 0, 0], 4864),
    gi(G2, "2g.10gb", 28, [2, 1, 0, 0, 0], 9856),
    gi(G3, "3g.20gb", 42, [3, 2, 0, 0, 0], 19968),
    gi(G4, "4g.20gb", 56, [4, 2, 0, 0, 0], 19968),
    gi(G7, "7g.40gb", 98, [7, 5, 0, 1, 1], 40192),
    gi(G1_ME, "1g.5gb+me", 14, [1, 1, 0, 1, 1], 4864),
    gi(G1_2X, "1g.10gb", 14, [1, 1, 0, 0, 0], 9856),
];

/// NVIDIA's MIG User Guide, A100 profile table. CHOSEN where the guide gives a range or an
/// approximation: 1g.20gb 19968 MB (≈ 19.50 GiB), 3g.40gb and 4g.40gb 40192 MB (39.25 of
/// 39.25-39.50 GiB).
pub static A100_80GB: &[GiProfile] = &[
    gi(G1, "1g.10gb", 14, [1, 0, 0, 0, 0], 9728),
    gi(G2, "2g.20gb", 28, [2, 1, 0, 0, 0], 19968),
    gi(G3, "3g.40gb", 42, [3, 2, 0, 0, 0], 40192),
    gi(G4, "4g.40gb", 56, [4, 2, 0, 0, 0], 40192),
    gi(G7, "7g.80gb", 98, [7, 5, 0, 1, 1], 80896),
    gi(G1_ME, "1g.10gb+me", 14, [1, 1, 0, 1, 1], 9728),
    gi(G1_2X, "1g.20gb", 14, [1, 1, 0, 0, 0], 19968),
];

/// The real H100 80GB HBM3, driver 580.159.04 (`nvml-sim/tests/data/real-h100/nvml-call-cost.json`
/// `mig_profiles`).
pub static H100_80GB: &[GiProfile] = &[
    gi(G1, "1g.10gb", 16, [1, 1, 0, 1, 0], 9984),
    gi(G2, "2g.20gb", 32, [2, 2, 0, 2, 0], 20096),
    gi(G3, "3g.40gb", 60, [3, 3, 0, 3, 0], 40448),
    gi(G4, "4g.40gb", 64, [4, 4, 0, 4, 0], 40448),
    gi(G7, "7g.80gb", 132, [8, 7, 0, 7, 1], 81152),
    gi(G1_ME, "1g.10gb+me", 16, [1, 1, 0, 1, 1], 9984),
    gi(G1_2X, "1g.20gb", 26, [1, 1, 0, 1, 0], 20096),
];

/// The real H200, driver 580.159.04 (`nvml-sim/tests/data/real-h200/nvml-call-cost.json`
/// `mig_profiles`; its memory sizes differ from the MIG guide's).
pub static H200_141GB: &[GiProfile] = &[
    gi(G1, "1g.18gb", 16, [1, 1, 0, 1, 0], 16384),
    gi(G2, "2g.35gb", 32, [2, 2, 0, 2, 0], 33280),
    gi(G3, "3g.71gb", 60, [3, 3, 0, 3, 0], 71424),
    gi(G4, "4g.71gb", 64, [4, 4, 0, 4, 0], 71424),
    gi(G7, "7g.141gb", 132, [8, 7, 0, 7, 1], 143360),
    gi(G1_ME, "1g.18gb+me", 16, [1, 1, 0, 1, 1], 16384),
    gi(G1_2X, "1g.35gb", 26, [1, 1, 0, 1, 0], 33280),
];

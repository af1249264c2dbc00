//! Device handles: addresses inside a static array, one slot per GPU index, so they are stable,
//! non-null, survive reloads and can be validated without being dereferenced.

use nvml_wrapper_sys::bindings::{nvmlDevice_st, nvmlDevice_t};

/// Most GPUs one scenario may describe (the size of the static handle array).
pub const MAX_GPUS: usize = 64;

/// What a device handle points to: one slot per GPU index, never freed.
#[repr(C)]
pub struct HandleSlot {
    index: u32,
}

static HANDLES: [HandleSlot; MAX_GPUS] = {
    let mut slots = [const { HandleSlot { index: 0 } }; MAX_GPUS];
    let mut i = 0;
    while i < MAX_GPUS {
        slots[i].index = i as u32;
        i += 1;
    }
    slots
};

/// The stable handle of GPU `index` (< MAX_GPUS).
pub fn handle_of(index: usize) -> nvmlDevice_t {
    std::ptr::from_ref(&HANDLES[index % MAX_GPUS])
        .cast_mut()
        .cast::<nvmlDevice_st>()
}

/// The GPU index a handle stands for, if it is one of ours.
pub fn index_of(handle: nvmlDevice_t) -> Option<usize> {
    let base = HANDLES.as_ptr() as usize;
    let offset = (handle as usize).checked_sub(base)?;
    let size = std::mem::size_of::<HandleSlot>();
    (offset % size == 0 && offset / size < MAX_GPUS).then_some(offset / size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        for i in [0, 1, 7, MAX_GPUS - 1] {
            assert_eq!(index_of(handle_of(i)), Some(i));
        }
        assert_eq!(index_of(std::ptr::null_mut()), None);
        let inside = (handle_of(0) as usize + 1) as nvmlDevice_t;
        assert_eq!(index_of(inside), None);
    }
}

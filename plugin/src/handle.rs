//! Event handles. A handle is never a pointer: it is a non-zero `u64` cast to `void*`:
//!
//! ```text
//! bits  0..3   tag (event class, never 0)
//! bits  3..11  sub (KernelCh channel, ProxyStep step slot, sentinel kind)
//! bits 11..32  slot index (21 bits: at most 2 Mi in-flight slots)
//! bits 32..64  slot generation at the time the handle was issued
//! ```
//! Stop/record decode the handle and check the slot's current generation, so a stale, doubled or
//! foreign handle is detected and ignored; nothing is ever dereferenced through a handle.

use core::ffi::c_void;

/// Stateless events (GroupApi, CollApi, P2pApi, KernelLaunch, Group, ProxyCtrl).
pub const TAG_SENTINEL: u8 = 1;
/// A Coll operation slot.
pub const TAG_COLL: u8 = 2;
/// A P2p operation slot.
pub const TAG_P2P: u8 = 3;
/// A KernelCh event of the operation in `index`; `sub` = channel.
pub const TAG_KERNEL_CH: u8 = 4;
/// A ProxyOp slot.
pub const TAG_PROXY_OP: u8 = 5;
/// A ProxyStep of the ProxyOp in `index`; `sub` = step slot.
pub const TAG_PROXY_STEP: u8 = 6;
/// A NetPlugin event slot (proxy pool).
pub const TAG_NET: u8 = 7;

/// Largest slot index a handle can carry.
pub const MAX_INDEX: u32 = (1 << 21) - 1;
/// Generation carried by sentinel handles (makes a random value unlikely to decode as one).
pub const SENTINEL_GEN: u32 = 0xC015_1647;

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub tag: u8,
    pub sub: u8,
    pub index: u32,
    pub gen: u32,
}

impl Handle {
    pub const fn new(tag: u8, sub: u8, index: u32, gen: u32) -> Handle {
        Handle {
            tag,
            sub,
            index,
            gen,
        }
    }

    /// The stateless handle of one event kind (`sub` distinguishes the kinds).
    pub const fn sentinel(sub: u8) -> Handle {
        Handle::new(TAG_SENTINEL, sub, 0, SENTINEL_GEN)
    }

    pub const fn encode(self) -> u64 {
        (self.tag as u64 & 7)
            | ((self.sub as u64) << 3)
            | (((self.index & MAX_INDEX) as u64) << 11)
            | ((self.gen as u64) << 32)
    }

    /// `None` for NULL (tag 0).
    pub const fn decode(raw: u64) -> Option<Handle> {
        let tag = (raw & 7) as u8;
        if tag == 0 {
            return None;
        }
        Some(Handle {
            tag,
            sub: ((raw >> 3) & 0xff) as u8,
            index: ((raw >> 11) as u32) & MAX_INDEX,
            gen: (raw >> 32) as u32,
        })
    }

    pub fn to_ptr(self) -> *mut c_void {
        self.encode() as usize as *mut c_void
    }

    pub fn from_ptr(p: *mut c_void) -> Option<Handle> {
        Handle::decode(p as usize as u64)
    }

    /// A sentinel issued by us (tag and generation both match).
    pub fn is_sentinel(self) -> bool {
        self.tag == TAG_SENTINEL && self.gen == SENTINEL_GEN && self.index == 0
    }
}

/// [`Handle::is_sentinel`] of a raw handle, without decoding it.
#[inline]
pub const fn is_sentinel_raw(raw: u64) -> bool {
    raw & !(0xff << 3) == ((SENTINEL_GEN as u64) << 32 | TAG_SENTINEL as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_are_never_null() {
        for tag in 1..=7u8 {
            for &(sub, index, gen) in &[
                (0u8, 0u32, 0u32),
                (255, MAX_INDEX, u32::MAX),
                (7, 12345, 99),
            ] {
                let h = Handle::new(tag, sub, index, gen);
                assert_ne!(h.encode(), 0);
                assert_eq!(Handle::decode(h.encode()), Some(h));
                assert_eq!(Handle::from_ptr(h.to_ptr()), Some(h));
            }
        }
        assert_eq!(Handle::decode(0), None);
        assert!(Handle::sentinel(3).is_sentinel());
        assert!(!Handle::new(TAG_SENTINEL, 3, 0, 1).is_sentinel());
        for raw in [
            Handle::sentinel(0).encode(),
            Handle::sentinel(255).encode(),
            Handle::new(TAG_SENTINEL, 7, 1, SENTINEL_GEN).encode(),
            Handle::new(TAG_COLL, 7, 0, SENTINEL_GEN).encode(),
            Handle::new(TAG_SENTINEL, 7, 0, SENTINEL_GEN ^ 1).encode(),
            0,
            u64::MAX,
        ] {
            let want = Handle::decode(raw).is_some_and(|h| h.is_sentinel());
            assert_eq!(is_sentinel_raw(raw), want, "{raw:#x}");
        }
    }
}

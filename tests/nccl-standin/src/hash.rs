//! 64-bit hashing for comm ids (our own function; NCCL's values differ, only the inputs match NCCL:
//! the unique id for init, (parent hash, split count, color) for split children).

/// splitmix64 finalizer.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a over bytes, finalized with `mix`.
pub fn bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// Split child hash from (parent hash, parent split count, color).
pub fn split(parent: u64, split_count: u32, color: i32) -> u64 {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&parent.to_le_bytes());
    v.extend_from_slice(&split_count.to_le_bytes());
    v.extend_from_slice(&color.to_le_bytes());
    bytes(&v)
}

/// Deterministic RNG (splitmix64 stream).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded stream.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// True with probability `pct`/100.
    pub fn chance(&mut self, pct: f64) -> bool {
        if pct <= 0.0 {
            return false;
        }
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) * 100.0 < pct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_hash_depends_on_every_input() {
        let a = split(1, 0, 0);
        assert_ne!(a, split(2, 0, 0));
        assert_ne!(a, split(1, 1, 0));
        assert_ne!(a, split(1, 0, 1));
    }

    #[test]
    fn rng_is_deterministic_and_roughly_calibrated() {
        let mut a = Rng::new(5);
        let mut b = Rng::new(5);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut r = Rng::new(9);
        let hits = (0..10_000).filter(|_| r.chance(30.0)).count();
        assert!((2500..3500).contains(&hits), "{hits}");
    }
}

//! `ncclConfig_t` as bytes: our own copy of a caller's config, NCCL's defaults, the `commName` slot.
//!
//! Layout (NCCL 2.27-2.30, LP64; tests/nccl-standin/README.md): `size` at 0 (`size_t`), `magic` at 8,
//! `version` at 12, `commName` at 48 (`const char*`, since 2.27 / `ncclConfig_v22700`). NCCL
//! structs are append-only, so one table of offsets serves every release.
//!
//! The shim never writes into the caller's struct (PyTorch reuses one config for many
//! communicators): it copies exactly `size` bytes into a [`ConfigBuf`] and changes that.

/// Offset of `commName`.
pub const COMM_NAME_OFFSET: usize = 48;
/// Smallest config that has `commName` (`ncclConfig_v22700` up to and including `commName`).
pub const MIN_NAMED_SIZE: usize = 56;
/// First NCCL version code with `commName`.
pub const NAMED_VERSION: u32 = 22700;
/// `NCCL_API_MAGIC`.
pub const MAGIC: u32 = 0xcafe_beef;
/// Largest caller config the shim copies; a bigger `size` is forwarded untouched.
pub const MAX_SIZE: usize = 512;
/// `sizeof(ncclConfig_t)` of NCCL 2.30 (the defaults the shim knows).
pub const DEFAULT_SIZE: usize = 96;

/// Offsets of the pointer fields (`netName`, `commName`); every other field after `version` is an
/// `int` whose default is `INT_MIN` (`NCCL_CONFIG_UNDEF_INT`).
const PTR_FIELDS: [usize; 2] = [32, COMM_NAME_OFFSET];

/// A config the shim owns: a copy of the caller's bytes (or NCCL's defaults) it may change.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigBuf {
    bytes: Vec<u8>,
}

impl std::fmt::Debug for ConfigBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigBuf")
            .field("size", &self.size())
            .field("version", &self.version())
            .field("comm_name", &self.comm_name_ptr())
            .finish()
    }
}

/// What to do with a caller's config.
#[derive(Debug, PartialEq, Eq)]
pub enum CallerConfig {
    /// Leave it alone: it names the communicator already, or it is too large / too small to copy.
    Untouched,
    /// Our copy (extended to carry `commName` if it was too old), ready for a name.
    Copy(ConfigBuf),
}

fn rd_u32(b: &[u8], off: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[off..off + 4]);
    u32::from_ne_bytes(w)
}

fn rd_usize(b: &[u8], off: usize) -> usize {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(w) as usize
}

/// The `size` field of a config header (its first 16 bytes).
pub fn header_size(header: &[u8; 16]) -> usize {
    rd_usize(header, 0)
}

impl ConfigBuf {
    /// `NCCL_CONFIG_INITIALIZER` of a 2.30 header, with `version` = the running NCCL's code.
    pub fn defaults(version: u32) -> ConfigBuf {
        let mut b = vec![0u8; DEFAULT_SIZE];
        b[0..8].copy_from_slice(&(DEFAULT_SIZE as u64).to_ne_bytes());
        b[8..12].copy_from_slice(&MAGIC.to_ne_bytes());
        b[12..16].copy_from_slice(&version.to_ne_bytes());
        let mut off = 16;
        while off < DEFAULT_SIZE {
            if PTR_FIELDS.contains(&off) {
                off += 8; // NULL
            } else {
                b[off..off + 4].copy_from_slice(&i32::MIN.to_ne_bytes());
                off += 4;
            }
        }
        ConfigBuf { bytes: b }
    }

    /// Our copy of a caller's config, given exactly its first `size` bytes (`size` read from its
    /// header; `bytes.len() == size`). `comm_name_set` says whether the caller's `commName` is a
    /// non-empty string (read by the caller of this function, which may dereference pointers).
    ///
    /// A copy shorter than [`MIN_NAMED_SIZE`] or older than 2.27 is extended with NCCL's defaults
    /// to 56 bytes and gets `version` 22700, so NCCL reads `commName`.
    pub fn from_caller(bytes: &[u8], comm_name_set: bool) -> CallerConfig {
        if comm_name_set || bytes.len() < 16 || bytes.len() > MAX_SIZE {
            return CallerConfig::Untouched;
        }
        let mut b = bytes.to_vec();
        let old = b.len() < MIN_NAMED_SIZE || rd_u32(&b, 12) < NAMED_VERSION;
        if b.len() < MIN_NAMED_SIZE {
            let d = ConfigBuf::defaults(NAMED_VERSION);
            b.extend_from_slice(&d.bytes[b.len()..MIN_NAMED_SIZE]);
            b[0..8].copy_from_slice(&(MIN_NAMED_SIZE as u64).to_ne_bytes());
        }
        if old {
            b[12..16].copy_from_slice(&NAMED_VERSION.to_ne_bytes());
        }
        CallerConfig::Copy(ConfigBuf { bytes: b })
    }

    /// The `size` field.
    pub fn size(&self) -> usize {
        rd_usize(&self.bytes, 0)
    }

    /// The `version` field.
    pub fn version(&self) -> u32 {
        rd_u32(&self.bytes, 12)
    }

    /// The `commName` pointer as an address (0 = NULL).
    pub fn comm_name_ptr(&self) -> usize {
        rd_usize(&self.bytes, COMM_NAME_OFFSET)
    }

    /// Set `commName` to the address of a NUL-terminated string that outlives every use (0 = NULL).
    pub fn set_comm_name_ptr(&mut self, addr: usize) {
        self.bytes[COMM_NAME_OFFSET..COMM_NAME_OFFSET + 8]
            .copy_from_slice(&(addr as u64).to_ne_bytes());
    }

    /// The bytes (what NCCL reads through the pointer the shim passes).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A pointer to the struct for NCCL (`ncclConfig_t*`). NCCL only reads it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(size: usize, version: u32) -> Vec<u8> {
        let mut b = ConfigBuf::defaults(version).bytes;
        b.resize(size.max(16), 0x5a);
        b[0..8].copy_from_slice(&(size as u64).to_ne_bytes());
        b[16..20].copy_from_slice(&0i32.to_ne_bytes()); // blocking = 0
        b
    }

    #[test]
    fn defaults_are_ncclconfig_initializer() {
        let d = ConfigBuf::defaults(23007);
        assert_eq!(d.size(), 96);
        assert_eq!(rd_u32(&d.bytes, 8), MAGIC);
        assert_eq!(d.version(), 23007);
        assert_eq!(d.comm_name_ptr(), 0);
        assert_eq!(rd_usize(&d.bytes, 32), 0);
        for off in [
            16, 20, 24, 28, 40, 44, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92,
        ] {
            assert_eq!(rd_u32(&d.bytes, off) as i32, i32::MIN, "offset {off}");
        }
    }

    #[test]
    fn copies_keep_caller_fields_and_extend_old_ones() {
        let c = caller(96, 23007);
        let CallerConfig::Copy(mut k) = ConfigBuf::from_caller(&c, false) else {
            panic!("copied")
        };
        assert_eq!(k.as_bytes(), &c[..]);
        k.set_comm_name_ptr(0x1234);
        assert_eq!(k.comm_name_ptr(), 0x1234);
        assert_eq!(k.size(), 96);

        let old = caller(48, 22600);
        let CallerConfig::Copy(k) = ConfigBuf::from_caller(&old, false) else {
            panic!("copied")
        };
        assert_eq!(k.size(), 56);
        assert_eq!(k.version(), NAMED_VERSION);
        assert_eq!(&k.as_bytes()[16..20], &0i32.to_ne_bytes(), "blocking kept");
        assert_eq!(k.comm_name_ptr(), 0);

        let v26 = caller(72, 22600);
        let CallerConfig::Copy(k) = ConfigBuf::from_caller(&v26, false) else {
            panic!("copied")
        };
        assert_eq!((k.size(), k.version()), (72, NAMED_VERSION));
    }

    #[test]
    fn named_huge_or_tiny_callers_are_left_alone() {
        assert_eq!(
            ConfigBuf::from_caller(&caller(96, 23007), true),
            CallerConfig::Untouched
        );
        assert_eq!(
            ConfigBuf::from_caller(&vec![0; MAX_SIZE + 8], false),
            CallerConfig::Untouched
        );
        assert_eq!(
            ConfigBuf::from_caller(&[0; 8], false),
            CallerConfig::Untouched
        );
    }
}

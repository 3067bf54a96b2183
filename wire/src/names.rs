//! Compact codes for the strings NCCL hands the profiler (`func`, `datatype`, `algo`, `proto`).
//!
//! NCCL passes static C strings; records store one byte each. Code 0 is always "Unknown": a string
//! we do not know maps to 0, and 0 renders back as "Unknown". Every other code maps both ways, so
//! binary <-> JSON conversion is lossless.

macro_rules! code_table {
    ($(#[$m:meta])* $name:ident, [$($s:literal),* $(,)?]) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u8);

        impl $name {
            /// The strings, indexed by code.
            pub const NAMES: &'static [&'static str] = &["Unknown", $($s),*];

            /// Code for a string as NCCL spells it; unknown strings give code 0.
            pub fn from_name(s: &str) -> Self {
                Self::NAMES.iter().position(|n| *n == s).map_or(Self(0), |i| Self(i as u8))
            }

            /// Code for a string, or `None` when the string is not in the table (JSON parsing).
            pub fn parse(s: &str) -> Option<Self> {
                Self::NAMES.iter().position(|n| *n == s).map(|i| Self(i as u8))
            }

            /// Code for raw bytes (a C string without its NUL).
            pub fn from_bytes(b: &[u8]) -> Self {
                core::str::from_utf8(b).map_or(Self(0), Self::from_name)
            }

            /// The string for this code ("Unknown" for 0 or codes beyond the table).
            pub fn name(self) -> &'static str {
                Self::NAMES.get(self.0 as usize).copied().unwrap_or("Unknown")
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

code_table!(
    /// Collective / P2P function, spelled as NCCL's `ncclFuncToString`.
    Func,
    [
        "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv",
        "AlltoAll", "Gather", "Scatter", "AllGatherV",
    ]
);

impl Func {
    pub const BROADCAST: Func = Func(1);
    pub const REDUCE: Func = Func(2);
    pub const ALL_GATHER: Func = Func(3);
    pub const REDUCE_SCATTER: Func = Func(4);
    pub const ALL_REDUCE: Func = Func(5);
    pub const SEND_RECV: Func = Func(6);
    pub const SEND: Func = Func(7);
    pub const RECV: Func = Func(8);
    pub const ALL_TO_ALL: Func = Func(9);
    pub const GATHER: Func = Func(10);
    pub const SCATTER: Func = Func(11);
}

code_table!(
    /// Data type, spelled as NCCL's profiler strings. Code = NCCL's `ncclDataType_t` + 1.
    DataType,
    [
        "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "ncclFloat16",
        "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2",
    ]
);

impl DataType {
    /// Element size in bytes (0 when unknown).
    pub fn size(self) -> u64 {
        match self.0 {
            1 | 2 | 11 | 12 => 1,
            7 | 10 => 2,
            3 | 4 | 8 => 4,
            5 | 6 | 9 => 8,
            _ => 0,
        }
    }

    /// From NCCL's `ncclDataType_t` value.
    pub fn from_nccl(v: i32) -> Self {
        if (0..=11).contains(&v) {
            DataType(v as u8 + 1)
        } else {
            DataType(0)
        }
    }
}

code_table!(
    /// Algorithm string.
    Algo,
    ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"]
);

code_table!(
    /// Protocol string.
    Proto,
    ["LL", "LL128", "SIMPLE"]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_name() {
        for (i, n) in Func::NAMES.iter().enumerate() {
            assert_eq!(Func::from_name(n).0 as usize, i);
        }
        for (i, n) in DataType::NAMES.iter().enumerate() {
            assert_eq!(DataType::parse(n).unwrap().0 as usize, i);
        }
        assert_eq!(Algo::from_name("RING").name(), "RING");
        assert_eq!(Proto::from_bytes(b"SIMPLE").name(), "SIMPLE");
    }

    #[test]
    fn unknown_strings_map_to_zero() {
        assert_eq!(Func::from_name("NotAThing"), Func(0));
        assert_eq!(Func(200).name(), "Unknown");
        assert!(Algo::parse("bogus").is_none());
    }

    #[test]
    fn datatype_sizes_follow_nccl() {
        assert_eq!(DataType::from_name("ncclFloat32").size(), 4);
        assert_eq!(DataType::from_nccl(9).name(), "ncclBfloat16");
        assert_eq!(DataType::from_nccl(5).size(), 8);
        assert_eq!(DataType::from_nccl(42), DataType(0));
    }
}

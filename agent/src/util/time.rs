//! Wall-clock readings.

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds since the Unix epoch (0 before it).
pub fn unix_us() -> u64 {
    unix_ns() / 1000
}

/// Nanoseconds since the Unix epoch (0 before it).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The UTC civil date and time of `ns` since the Unix epoch: `(year, month, day, hour, minute,
/// second, millisecond)` (Howard Hinnant's `civil_from_days`).
pub fn utc_parts(ns: u64) -> (i64, i64, i64, u64, u64, u64, u64) {
    let secs = ns / 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        (ns / 1_000_000) % 1000,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_parts_of_known_instants() {
        assert_eq!(super::utc_parts(0), (1970, 1, 1, 0, 0, 0, 0));
        // 2025-12-05T02:00:00.123Z and 2000-02-29T23:59:59.999Z.
        assert_eq!(
            super::utc_parts(1_764_900_000_123_000_000),
            (2025, 12, 5, 2, 0, 0, 123)
        );
        assert_eq!(
            super::utc_parts(951_868_799_999_000_000),
            (2000, 2, 29, 23, 59, 59, 999)
        );
    }
}

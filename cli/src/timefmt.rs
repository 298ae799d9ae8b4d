//! Node heartbeat times: ms-epoch to UTC `YYYY-MM-DD HH:MM:SS` and "N s ago", std only.

/// Formats milliseconds since the Unix epoch as UTC `YYYY-MM-DD HH:MM:SS`.
pub fn format_utc_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// How long before `now_ms` the time `ms` was, in whole seconds.
pub fn format_ago(now_ms: i64, ms: i64) -> String {
    let delta = now_ms.saturating_sub(ms);
    if delta >= 0 {
        format!("{}s ago", delta / 1000)
    } else {
        // A node's clock ahead of ours: say so rather than print a negative age.
        format!("{}s ahead", delta.unsigned_abs() / 1000)
    }
}

/// Milliseconds since the Unix epoch now; 0 if the clock is before 1970.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Proleptic Gregorian (year, month, day) of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc_ms(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc_ms(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_utc_ms(1_709_251_199_999), "2024-02-29 23:59:59");
        assert_eq!(format_utc_ms(1_469_805_221_996), "2016-07-29 15:13:41");
        assert_eq!(format_utc_ms(-1), "1969-12-31 23:59:59");
        assert_eq!(format_utc_ms(253_402_300_799_000), "9999-12-31 23:59:59");
    }

    #[test]
    fn ages() {
        assert_eq!(format_ago(10_999, 1_000), "9s ago");
        assert_eq!(format_ago(1_000, 1_000), "0s ago");
        assert_eq!(format_ago(1_000, 4_500), "3s ahead");
        assert_eq!(
            format_ago(i64::MAX, i64::MIN),
            format!("{}s ago", i64::MAX / 1000)
        );
    }
}

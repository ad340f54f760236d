//! RFC 3339 date-times as the Kubernetes API accepts them, the one validator for the `date-time`
//! format of our schemas, and the serde adapters of the user-written times in our specs.
//!
//! `k8s_openapi`'s `Time` holds a `jiff::Timestamp`, whose range ends at
//! `9999-12-30T22:00:00.999999999Z` (so that any offset can be applied to it), while RFC 3339 and
//! the API server accept every instant up to `9999-12-31T23:59:59.999999999Z`. A user writing
//! that far future as "never" (`shutdownTime: 9999-12-31T23:59:59Z`) must not make the object
//! undecodable, so [`parse`] saturates to `Timestamp::MAX`, and [`format()`] writes
//! `Timestamp::MAX` back as [`END_OF_TIME`]: the round trip of that value is exact.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::Offset;
use serde::{Deserialize, Deserializer, Serializer};

/// The last second RFC 3339 can write, which [`format()`] gives for `Timestamp::MAX`.
pub const END_OF_TIME: &str = "9999-12-31T23:59:59Z";

/// Parses an RFC 3339 `date-time` (`2026-01-02T15:04:05Z`, `2026-01-02T15:04:05.5+01:00`):
/// four-digit year, a real calendar date, hours 00-23, minutes and seconds 00-59, up to nine
/// fractional digits, and `Z` or an offset of at most 23:59; `t` and `z` may be lower case.
/// Instants beyond what a `Timestamp` holds saturate to `Timestamp::MAX` (or `MIN`). `None` when
/// `text` is not such a date-time.
///
/// Seconds stop at 59: kube-openapi's `strfmt.IsDateTime`, which the API server uses, refuses a
/// leap second. Its pattern is laxer than RFC 3339 in ways we do not copy (any character before
/// the fraction, any number of fractional digits, any two digits as offset hours or minutes):
/// such a value passes a real cluster, but no client's time type decodes it, so accepting it
/// would only move the failure into a controller.
pub fn parse(text: &str) -> Option<Timestamp> {
    let bytes = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i32> {
        let part = bytes.get(from..from + len)?;
        part.iter().try_fold(0_i32, |acc, byte| {
            byte.is_ascii_digit()
                .then(|| acc * 10 + i32::from(byte - b'0'))
        })
    };
    let literal = |at: usize, expected: &[u8]| bytes.get(at).is_some_and(|b| expected.contains(b));
    let year = digits(0, 4)?;
    let month = digits(5, 2)?;
    let day = digits(8, 2)?;
    let hour = digits(11, 2)?;
    let minute = digits(14, 2)?;
    let second = digits(17, 2)?;
    if !(literal(4, b"-")
        && literal(7, b"-")
        && literal(10, b"Tt")
        && literal(13, b":")
        && literal(16, b":"))
    {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0_i32;
    if literal(at, b".") {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        let count = at - start;
        if count == 0 || count > 9 {
            return None;
        }
        let fraction = digits(start, count)?;
        nanos = fraction * 10_i32.pow(u32::try_from(9 - count).ok()?);
    }
    let offset_seconds = match bytes.get(at) {
        Some(b'Z' | b'z') if bytes.len() == at + 1 => 0,
        Some(sign @ (b'+' | b'-')) if bytes.len() == at + 6 && literal(at + 3, b":") => {
            let hours = digits(at + 1, 2)?;
            let minutes = digits(at + 4, 2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let magnitude = hours * 3600 + minutes * 60;
            if *sign == b'-' { -magnitude } else { magnitude }
        }
        _ => return None,
    };
    let civil = DateTime::new(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
        i8::try_from(hour).ok()?,
        i8::try_from(minute).ok()?,
        i8::try_from(second).ok()?,
        nanos,
    )
    .ok()?;
    let offset = Offset::from_seconds(offset_seconds).ok()?;
    Some(offset.to_timestamp(civil).unwrap_or(if year >= 9999 {
        Timestamp::MAX
    } else {
        Timestamp::MIN
    }))
}

/// Writes `at` as the API server does (whole seconds, UTC); `Timestamp::MAX` as [`END_OF_TIME`].
pub fn format(at: Timestamp) -> String {
    if at == Timestamp::MAX {
        return END_OF_TIME.to_owned();
    }
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `deserialize_with` for an optional user-written `date-time` (see the module docs).
pub fn deserialize_optional<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Time>, D::Error> {
    let text: Option<String> = Option::deserialize(deserializer)?;
    text.map(|text| {
        parse(&text).map(Time).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid date-time {text:?}: expected RFC 3339, e.g. 2026-01-02T15:04:05Z"
            ))
        })
    })
    .transpose()
}

/// `serialize_with` for an optional user-written `date-time` (see the module docs).
pub fn serialize_optional<S: Serializer>(
    value: &Option<Time>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(time) => serializer.serialize_some(&format(time.0)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_rfc3339_up_to_the_end_of_year_9999() {
        let cases = [
            ("2026-01-02T15:04:05Z", "2026-01-02T15:04:05Z"),
            ("2026-01-02t15:04:05z", "2026-01-02T15:04:05Z"),
            ("2026-01-02T15:04:05.5+01:00", "2026-01-02T14:04:05.5Z"),
            (
                "2026-01-02T15:04:05.123456789-23:59",
                "2026-01-03T15:03:05.123456789Z",
            ),
            ("2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z"),
            ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Some(expected.parse().unwrap()), "{text}");
        }
        assert_eq!(parse("9999-12-31T23:59:59Z"), Some(Timestamp::MAX));
        assert_eq!(
            parse("9999-12-31T23:59:59.999999999Z"),
            Some(Timestamp::MAX)
        );
        assert_eq!(parse("9999-12-31T23:59:59+01:00"), Some(Timestamp::MAX));
        assert_eq!(
            parse("9999-12-30T12:00:00Z"),
            Some("9999-12-30T12:00:00Z".parse().unwrap()),
            "inside jiff's range: not saturated"
        );
    }

    #[test]
    fn rejects_what_rfc3339_does_not_allow() {
        for text in [
            "",
            "2026-01-02",
            "2026-01-02T15:04Z",
            "2026-01-02 15:04:05Z",
            "2026-01-02T15:04:05",
            "2026-01-02T15:04:05+25:00",
            "2026-01-02T15:04:05+01:60",
            "2026-01-02T15:04:05+0100",
            "2026-01-02T24:00:00Z",
            "2026-01-02T15:60:00Z",
            "2026-01-02T15:04:60Z",
            "2026-13-02T15:04:05Z",
            "2025-02-29T15:04:05Z",
            "2026-04-31T15:04:05Z",
            "2026-01-02T15:04:05.Z",
            "2026-01-02T15:04:05.1234567890Z",
            "+2026-01-02T15:04:05Z",
            "10000-01-01T00:00:00Z",
            "2026-01-02T15:04:05Zjunk",
            "２026-01-02T15:04:05Z",
        ] {
            assert_eq!(parse(text), None, "{text:?} must be rejected");
        }
    }

    #[test]
    fn the_end_of_time_round_trips_exactly() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Holder {
            #[serde(
                default,
                skip_serializing_if = "Option::is_none",
                deserialize_with = "deserialize_optional",
                serialize_with = "serialize_optional"
            )]
            at: Option<Time>,
        }
        for text in [END_OF_TIME, "2026-01-02T15:04:05Z"] {
            let json = serde_json::json!({ "at": text });
            let holder: Holder = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(serde_json::to_value(&holder).unwrap(), json);
        }
        let holder: Holder = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(holder, Holder { at: None });
        let error = serde_json::from_value::<Holder>(serde_json::json!({"at": "soon"}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid date-time \"soon\""), "{error}");
    }
}

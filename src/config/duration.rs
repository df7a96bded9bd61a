//! Durations written with units in config files (`"60s"`, `"250ms"`, `"2m"`),
//! parsed by `humantime` so operators never guess whether a number is ms or s.

use serde::{Deserialize, Deserializer, Serializer};
use std::time::Duration;

/// Serde adapter: `#[serde(with = "crate::config::duration")]`.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {text:?}: {e} (write a number with a unit, e.g. \"60s\" or \"250ms\")"
        ))
    })
}

/// Serializes as humantime text, the same form the parser reads.
pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}

/// The same adapter for optional fields.
pub mod option {
    use super::*;

    /// Reads an optional duration with units.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(deserializer).map(Some)
    }

    /// Writes an optional duration as humantime text.
    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_none(),
        }
    }
}

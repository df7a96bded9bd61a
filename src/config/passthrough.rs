//! The provider endpoints a route may pass through unmetered (`[[routes]]
//! passthrough`): each family, its paths under `/v1`, and what it is.

use serde::{Deserialize, Serialize};

/// A family of provider endpoints passed through as they are, counted as one
/// request each against the tenant's request limit (no tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Passthrough {
    /// The Responses API beside `POST /v1/responses` (which is metered):
    /// `GET`/`DELETE /v1/responses/{id}`, `.../cancel`, `.../input_items`.
    Responses,
    /// `/v1/files` (uploads and downloads stream through, never held whole).
    Files,
    /// `/v1/uploads` (large files in parts).
    Uploads,
    /// `/v1/batches`.
    Batches,
    /// `/v1/images/...` (generations, edits, variations).
    Images,
    /// `/v1/audio/...` (speech, transcriptions, translations).
    Audio,
    /// `/v1/moderations`.
    Moderations,
}

impl Passthrough {
    /// Every family.
    pub const ALL: [Passthrough; 7] = [
        Passthrough::Responses,
        Passthrough::Files,
        Passthrough::Uploads,
        Passthrough::Batches,
        Passthrough::Images,
        Passthrough::Audio,
        Passthrough::Moderations,
    ];

    /// The family a path under `/v1` belongs to, if any (`POST /v1/responses`
    /// itself is metered, not passed through).
    pub fn of_path(path: &str) -> Option<Passthrough> {
        let rest = path.strip_prefix("/v1/")?;
        let (head, tail) = rest.split_once('/').unwrap_or((rest, ""));
        match head {
            "responses" if !tail.is_empty() => Some(Passthrough::Responses),
            "files" => Some(Passthrough::Files),
            "uploads" => Some(Passthrough::Uploads),
            "batches" => Some(Passthrough::Batches),
            "images" if !tail.is_empty() => Some(Passthrough::Images),
            "audio" if !tail.is_empty() => Some(Passthrough::Audio),
            "moderations" if tail.is_empty() => Some(Passthrough::Moderations),
            _ => None,
        }
    }

    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Passthrough::Responses => "responses",
            Passthrough::Files => "files",
            Passthrough::Uploads => "uploads",
            Passthrough::Batches => "batches",
            Passthrough::Images => "images",
            Passthrough::Audio => "audio",
            Passthrough::Moderations => "moderations",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_their_family_and_the_metered_ones_to_none() {
        let of = Passthrough::of_path;
        assert_eq!(of("/v1/responses/resp_1"), Some(Passthrough::Responses));
        assert_eq!(
            of("/v1/responses/resp_1/input_items"),
            Some(Passthrough::Responses)
        );
        assert_eq!(of("/v1/responses"), None, "metered");
        assert_eq!(of("/v1/files"), Some(Passthrough::Files));
        assert_eq!(of("/v1/files/file-1/content"), Some(Passthrough::Files));
        assert_eq!(of("/v1/images/generations"), Some(Passthrough::Images));
        assert_eq!(of("/v1/audio/speech"), Some(Passthrough::Audio));
        assert_eq!(of("/v1/moderations"), Some(Passthrough::Moderations));
        assert_eq!(of("/v1/chat/completions"), None);
        assert_eq!(of("/v2/files"), None);
        for family in Passthrough::ALL {
            let name = serde_json::to_string(&family).unwrap();
            assert_eq!(name, format!("\"{}\"", family.as_str()));
        }
    }
}

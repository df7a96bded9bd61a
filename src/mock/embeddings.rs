//! OpenAI's `POST /v1/embeddings`: usage `{prompt_tokens, total_tokens}` and small,
//! deterministic unit vectors derived from each input (floats, or base64 of
//! little-endian `f32` as the official SDKs request by default).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

use super::count::Counter;
use super::error::{ApiError, Flavor};
use super::log::Api;
use super::request::{self, EmbeddingsRequest, Prompt};
use super::state::{Admission, Charge, MockState};
use super::stream::{json_response, to_json};

/// Vector length when the request does not ask for `dimensions`.
const DEFAULT_DIMENSIONS: u64 = 16;
/// Largest `dimensions` accepted (text-embedding-3-large's size).
const MAX_DIMENSIONS: u64 = 3072;

#[derive(Serialize)]
struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<Embedding>,
    model: &'a str,
    usage: EmbeddingUsage,
}

#[derive(Serialize)]
struct Embedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct EmbeddingUsage {
    prompt_tokens: u64,
    total_tokens: u64,
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match embeddings_response(&mock, &headers, body).await {
        Ok(response) => response,
        Err(error) => mock.refuse(Api::Embeddings, Flavor::OpenAi, error).await,
    }
}

async fn embeddings_response(
    mock: &Arc<MockState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = request::read_body(mock, headers, body)?;
    let req: EmbeddingsRequest = request::parse(&bytes)?;
    req.input.validate("input", false)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::Invalid(format!(
                "Invalid 'encoding_format': expected 'float' or 'base64', got '{other}'."
            )));
        }
    };
    let dimensions = req.dimensions.unwrap_or(DEFAULT_DIMENSIONS);
    if !(1..=MAX_DIMENSIONS).contains(&dimensions) {
        return Err(ApiError::Invalid(format!(
            "Invalid 'dimensions': expected 1..={MAX_DIMENSIONS}, got {dimensions}."
        )));
    }
    mock.check_model(&req.model)?;
    let prompt_tokens = req.input.count(Counter::for_model(&req.model));
    let charge = Charge {
        api: Api::Embeddings,
        model: &req.model,
        prompt_tokens,
        completion_tokens: 0,
        output_cap: None,
        stream: false,
    };
    let Admission {
        slot: _slot,
        headers,
    } = mock.admit(charge).await?;
    mock.first_byte_delay(false, 0).await;
    let data = input_seeds(&req.input)
        .into_iter()
        .enumerate()
        .map(|(index, seed)| {
            let floats = unit_vector(seed, dimensions);
            let embedding = if base64 {
                Vector::Base64(f32_base64(&floats))
            } else {
                Vector::Floats(floats)
            };
            Embedding {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    let usage = EmbeddingUsage {
        prompt_tokens,
        total_tokens: prompt_tokens,
    };
    let list = EmbeddingList {
        object: "list",
        data,
        model: &req.model,
        usage,
    };
    Ok(json_response(to_json(&list), headers))
}

/// FNV-1a over bytes: the seed of one input's vector.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn input_seeds(input: &Prompt<'_>) -> Vec<u64> {
    let tokens = |list: &[u32]| fnv1a(list.iter().flat_map(|t| t.to_le_bytes()));
    match input {
        Prompt::Text(text) => vec![fnv1a(text.bytes())],
        Prompt::Texts(texts) => texts.iter().map(|t| fnv1a(t.bytes())).collect(),
        Prompt::Tokens(list) => vec![tokens(list)],
        Prompt::TokenLists(lists) => lists.iter().map(|l| tokens(l)).collect(),
    }
}

/// A deterministic vector of length 1 (xorshift64* from `seed`).
fn unit_vector(seed: u64, dimensions: u64) -> Vec<f32> {
    let mut state = seed | 1;
    let mut values: Vec<f32> = (0..dimensions)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (bits as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        values.iter_mut().for_each(|v| *v /= norm);
    }
    values
}

/// Standard base64 (with padding) of the little-endian bytes of `floats`.
fn f32_base64(floats: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        // 1.0f32 = 00 00 80 3f; 2.0f32 = 00 00 00 40.
        assert_eq!(f32_base64(&[1.0]), "AACAPw==");
        assert_eq!(f32_base64(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(f32_base64(&[]), "");
    }

    #[test]
    fn vectors_are_unit_length_and_deterministic() {
        let a = unit_vector(fnv1a(b"hello".iter().copied()), 16);
        assert_eq!(a, unit_vector(fnv1a(b"hello".iter().copied()), 16));
        assert_ne!(a, unit_vector(fnv1a(b"world".iter().copied()), 16));
        let norm: f32 = a.iter().map(|v| v * v).sum();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
}

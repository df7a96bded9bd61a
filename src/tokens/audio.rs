//! An audio part's token cost from its length, when the request carries the
//! audio itself (OpenAI's `input_audio`: base64 `wav` or `mp3`). OpenAI counts
//! audio input at ten tokens a second (a token per 100 ms: its gpt-4o audio
//! launch priced input audio at $100 per million tokens and "about $0.06 a
//! minute", 600 tokens), so a part costs its duration in tenths of a second,
//! rounded up.
//!
//! - `wav`: the duration from the header's byte rate and the data's length.
//! - `mp3`: from the first frame's bitrate (a constant bitrate assumed) and the
//!   data's length. A variable-bitrate file whose first frame is richer than
//!   its average is reserved short; the settlement charges the rest.
//! - Anything else, or a header that does not parse: the longest audio the
//!   data could hold at 8 kbit/s, the lowest mp3 bitrate.

use base64::Engine;

/// Audio tokens per second of input audio.
pub const AUDIO_TOKENS_PER_SECOND: u64 = 10;

/// Bytes a second of the leanest audio the bound assumes (8 kbit/s).
const LEANEST_BYTES_PER_SECOND: u64 = 1_000;

/// Most of the audio decoded to find its header: a wav's chunks before `data`,
/// or an mp3's ID3 tag and first frame header, are seldom longer.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The tokens of an `input_audio` part of `format` whose base64 audio is `data`.
pub fn input_audio_tokens(data: &str, format: Option<&str>) -> u64 {
    let length = decoded_len(data);
    let duration_ms = match format {
        Some("wav") => wav_duration_ms(data, length),
        Some("mp3") => mp3_duration_ms(data, length),
        _ => None,
    }
    .unwrap_or_else(|| (length * 1_000).div_ceil(LEANEST_BYTES_PER_SECOND));
    (duration_ms * AUDIO_TOKENS_PER_SECOND).div_ceil(1_000)
}

/// The bytes `data` decodes to (its length, less the padding).
fn decoded_len(data: &str) -> u64 {
    let data = data.trim_end();
    let padding = data.bytes().rev().take_while(|b| *b == b'=').count() as u64;
    (data.len() as u64 / 4 * 3).saturating_sub(padding)
}

/// The first bytes of the base64 `data`, up to `MAX_HEADER_BYTES`.
fn head(data: &str) -> Option<Vec<u8>> {
    let chars = (MAX_HEADER_BYTES / 3 * 4).min(data.len() / 4 * 4);
    base64::engine::general_purpose::STANDARD
        .decode(&data.as_bytes()[..chars])
        .ok()
}

/// A RIFF/WAVE file's duration: its `data` chunk (to the end of the data, as
/// a streamed file's length field may be a placeholder) over the `fmt `
/// chunk's byte rate.
fn wav_duration_ms(data: &str, length: u64) -> Option<u64> {
    let bytes = head(data)?;
    if bytes.get(0..4)? != b"RIFF" || bytes.get(8..12)? != b"WAVE" {
        return None;
    }
    let (mut at, mut byte_rate) = (12usize, None);
    while let Some(chunk) = bytes.get(at..at + 8) {
        let size = u32::from_le_bytes(chunk[4..8].try_into().ok()?) as usize;
        match &chunk[0..4] {
            b"fmt " => {
                let rate = bytes.get(at + 16..at + 20)?;
                byte_rate = Some(u64::from(u32::from_le_bytes(rate.try_into().ok()?)));
            }
            b"data" => {
                let audio = length.saturating_sub(at as u64 + 8);
                let rate = byte_rate.filter(|r| *r > 0)?;
                return Some((audio * 1_000).div_ceil(rate));
            }
            _ => {}
        }
        // Chunks are padded to an even size.
        at = at.checked_add(8 + size + size % 2)?;
    }
    None
}

/// An MPEG audio file's duration by its first frame's bitrate: the bytes
/// after an ID3v2 tag, in bits, over kbit/s (= ms).
fn mp3_duration_ms(data: &str, length: u64) -> Option<u64> {
    let bytes = head(data)?;
    let mut at = 0usize;
    if bytes.get(0..3)? == b"ID3" {
        let size = bytes
            .get(6..10)?
            .iter()
            .fold(0usize, |n, b| n << 7 | usize::from(b & 0x7f));
        let footer = if bytes.get(5)? & 0x10 != 0 { 10 } else { 0 };
        at = 10 + size + footer;
    }
    let kbps = frame_bitrate_kbps(bytes.get(at..at + 4)?)?;
    let audio = length.saturating_sub(at as u64);
    Some((audio * 8).div_ceil(kbps))
}

/// The bitrate of a Layer III frame header, in kbit/s.
fn frame_bitrate_kbps(header: &[u8]) -> Option<u64> {
    const MPEG1: [u64; 15] = [
        0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320,
    ];
    const MPEG2: [u64; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
    let (b1, b2) = (*header.first()?, *header.get(1)?);
    let sync = b1 == 0xff && b2 & 0xe0 == 0xe0;
    let layer_iii = (b2 >> 1) & 0b11 == 0b01;
    let version = (b2 >> 3) & 0b11;
    let index = usize::from(header.get(2)? >> 4);
    if !sync || !layer_iii || version == 0b01 || index == 0 || index == 15 {
        return None;
    }
    let table = if version == 0b11 { &MPEG1 } else { &MPEG2 };
    Some(table[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A PCM wav of `seconds` at 24 kHz, 16-bit mono (48,000 bytes a second).
    fn wav(seconds: u32) -> Vec<u8> {
        let audio = 48_000 * seconds;
        let mut out = b"RIFF".to_vec();
        out.extend((36 + audio).to_le_bytes());
        out.extend(b"WAVEfmt ");
        out.extend(16u32.to_le_bytes());
        out.extend(1u16.to_le_bytes()); // PCM
        out.extend(1u16.to_le_bytes()); // mono
        out.extend(24_000u32.to_le_bytes());
        out.extend(48_000u32.to_le_bytes());
        out.extend(2u16.to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend(b"data");
        out.extend(audio.to_le_bytes());
        out.resize(out.len() + audio as usize, 0);
        out
    }

    #[test]
    fn a_wav_costs_ten_tokens_a_second_by_its_header() {
        assert_eq!(input_audio_tokens(&b64(&wav(3)), Some("wav")), 30);
        let mut half = wav(1);
        half.truncate(44 + 24_001);
        assert_eq!(
            input_audio_tokens(&b64(&half), Some("wav")),
            6,
            "rounded up"
        );
    }

    #[test]
    fn an_mp3_costs_its_length_at_its_first_frames_bitrate() {
        // MPEG-1 Layer III, 128 kbit/s, 48 kHz: 384-byte frames of 24 ms.
        let frame = [&[0xff, 0xfb, 0x94, 0x00][..], &[0u8; 380]].concat();
        let mut mp3 = b"ID3\x04\x00\x00\x00\x00\x00\x05".to_vec();
        mp3.extend([0u8; 5]);
        mp3.extend(frame.repeat(125));
        assert_eq!(input_audio_tokens(&b64(&mp3), Some("mp3")), 30, "3 s");
    }

    #[test]
    fn unknown_or_broken_audio_is_bounded_by_its_length() {
        let data = b64(&[7u8; 3_000]);
        assert_eq!(input_audio_tokens(&data, Some("flac")), 30);
        assert_eq!(input_audio_tokens(&data, Some("wav")), 30);
        assert_eq!(input_audio_tokens(&data, Some("mp3")), 30);
        assert_eq!(input_audio_tokens("", Some("wav")), 0);
        assert_eq!(input_audio_tokens("!!!!", None), 1, "3 bytes, by length");
    }
}

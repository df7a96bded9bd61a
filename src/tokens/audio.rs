//! An audio part's token cost from its length, when the request carries the
//! audio itself (OpenAI's `input_audio`: base64 `wav` or `mp3`). OpenAI counts
//! audio input at ten tokens a second (a token per 100 ms: its gpt-4o audio
//! launch priced input audio at $100 per million tokens and "about $0.06 a
//! minute", 600 tokens), so a part costs its duration in tenths of a second,
//! rounded up.
//!
//! - `wav`: the duration from the header's rate and the data's length.
//! - `mp3`: from the lowest bitrate among the frames of its first 64 KiB (a
//!   constant bitrate assumed from there) and the data's length. A
//!   variable-bitrate file whose later frames are leaner than any of those is
//!   reserved short; the settlement charges the rest.
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

/// Up to `len` bytes of the base64 `data` from byte `offset` on (base64 is
/// entered at the 4-character group holding it), if they decode.
fn decode_at(data: &str, offset: usize, len: usize) -> Option<Vec<u8>> {
    let first = offset / 3 * 4;
    let skip = offset % 3;
    let last = (first + (skip + len).div_ceil(3) * 4).min(data.len() / 4 * 4);
    let text = data.as_bytes().get(first..last)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    Some(bytes.get(skip..)?.to_vec())
}

/// A RIFF/WAVE file's duration: its `data` chunk (to the end of the data, as
/// a streamed file's length field may be a placeholder) over its bytes a
/// second: the smaller of the `fmt ` chunk's byte rate and sample rate x
/// channels x bytes per sample, so a header that overstates one is not
/// believed.
fn wav_duration_ms(data: &str, length: u64) -> Option<u64> {
    let bytes = decode_at(data, 0, MAX_HEADER_BYTES)?;
    if bytes.get(0..4)? != b"RIFF" || bytes.get(8..12)? != b"WAVE" {
        return None;
    }
    let le16 = |at: usize| {
        Some(u64::from(u16::from_le_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let le32 = |at: usize| {
        Some(u64::from(u32::from_le_bytes(
            bytes.get(at..at + 4)?.try_into().ok()?,
        )))
    };
    let (mut at, mut per_second) = (12usize, None);
    while at.checked_add(8)? <= bytes.len() {
        let size = usize::try_from(le32(at + 4)?).ok()?;
        match bytes.get(at..at + 4)? {
            b"fmt " => {
                let (channels, rate, byte_rate) = (le16(at + 10)?, le32(at + 12)?, le32(at + 16)?);
                let sampled = rate * channels * le16(at + 22)? / 8;
                per_second = Some(byte_rate.min(sampled));
            }
            b"data" => {
                let audio = length.saturating_sub(at as u64 + 8);
                let rate = per_second.filter(|r| *r > 0)?;
                return Some((audio * 1_000).div_ceil(rate));
            }
            _ => {}
        }
        // Chunks are padded to an even size.
        at = at
            .checked_add(8)?
            .checked_add(size)?
            .checked_add(size % 2)?;
    }
    None
}

/// An MPEG audio file's duration: the bytes after an ID3v2 tag, in bits, over
/// the lowest bitrate of the frames in its first `MAX_HEADER_BYTES` (kbit/s,
/// giving ms), plus 0.5%: an encoder that leaves out padding frames runs a
/// little below its nominal bitrate (0.23% at 44.1 kHz).
fn mp3_duration_ms(data: &str, length: u64) -> Option<u64> {
    let tag = decode_at(data, 0, 10)?;
    let mut start = 0usize;
    if tag.get(0..3)? == b"ID3" {
        let size = tag
            .get(6..10)?
            .iter()
            .fold(0usize, |n, b| n << 7 | usize::from(b & 0x7f));
        let footer = if tag.get(5)? & 0x10 != 0 { 10 } else { 0 };
        start = 10 + size + footer;
    }
    let frames = decode_at(data, start, MAX_HEADER_BYTES)?;
    let kbps = lowest_bitrate_kbps(&frames)?;
    let audio = length.saturating_sub(start as u64);
    let ms = (audio * 8).div_ceil(kbps);
    Some(ms + ms.div_ceil(200))
}

/// The lowest bitrate among the Layer III frames at the start of `bytes`,
/// walked frame by frame (a variable-bitrate file is reserved by its leanest
/// frame seen, not its first).
fn lowest_bitrate_kbps(bytes: &[u8]) -> Option<u64> {
    let mut at = 0;
    let mut lowest: Option<u64> = None;
    while let Some((kbps, length)) = bytes.get(at..at + 4).and_then(frame_header) {
        lowest = Some(lowest.map_or(kbps, |l| l.min(kbps)));
        at += length;
    }
    lowest
}

/// A Layer III frame header's bitrate (kbit/s) and frame length (bytes).
fn frame_header(header: &[u8]) -> Option<(u64, usize)> {
    const MPEG1: [u64; 15] = [
        0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320,
    ];
    const MPEG2: [u64; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
    const RATES: [u64; 3] = [44_100, 48_000, 32_000];
    let (b1, b2, b3) = (header[0], header[1], header[2]);
    let sync = b1 == 0xff && b2 & 0xe0 == 0xe0;
    let layer_iii = (b2 >> 1) & 0b11 == 0b01;
    let version = (b2 >> 3) & 0b11;
    let index = usize::from(b3 >> 4);
    if !sync || !layer_iii || version == 0b01 || index == 0 || index == 15 {
        return None;
    }
    let (kbps, divisor, per_frame) = match version {
        0b11 => (MPEG1[index], 1, 144),
        0b10 => (MPEG2[index], 2, 72),
        _ => (MPEG2[index], 4, 72),
    };
    let rate = RATES.get(usize::from((b3 >> 2) & 0b11))? / divisor;
    let length = per_frame * kbps * 1_000 / rate + u64::from((b3 >> 1) & 1);
    Some((kbps, usize::try_from(length).ok()?.max(4)))
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
    fn an_mp3_costs_its_length_at_its_leanest_frames_bitrate() {
        // MPEG-1 Layer III, 128 kbit/s, 48 kHz: 384-byte frames of 24 ms.
        let frame = [&[0xff, 0xfb, 0x94, 0x00][..], &[0u8; 380]].concat();
        let mut mp3 = b"ID3\x04\x00\x00\x00\x00\x00\x05".to_vec();
        mp3.extend([0u8; 5]);
        mp3.extend(frame.repeat(125));
        // 3 s, and 0.5% for encoders that leave out padding frames.
        assert_eq!(input_audio_tokens(&b64(&mp3), Some("mp3")), 31);
        // A leaner frame after the first sets the rate: 64 kbit/s, 192 bytes.
        let lean = [&[0xff, 0xfb, 0x54, 0x00][..], &[0u8; 188]].concat();
        let vbr = [frame.clone(), lean.repeat(250)].concat();
        let seconds = (384 + 250 * 192) * 8 / 64_000;
        assert_eq!(
            input_audio_tokens(&b64(&vbr), Some("mp3")),
            61,
            "{seconds} s and more"
        );
    }

    #[test]
    fn a_wav_header_overstating_its_byte_rate_is_not_believed() {
        let mut loud = wav(3);
        loud[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(input_audio_tokens(&b64(&loud), Some("wav")), 30);
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

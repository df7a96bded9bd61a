//! The mock's count of an `input_audio` part, as OpenAI documents audio
//! input: ten tokens a second of audio (a token per 100 ms), the seconds
//! measured from the audio itself, independently of the gateway's estimator
//! (`crate::tokens::audio`, which reads a bitrate; this walks the frames):
//!
//! - `wav`: the `data` chunk's bytes over sample rate x channels x bytes per
//!   sample, from the `fmt ` chunk.
//! - `mp3`: every MPEG Layer III frame's samples (1,152, or 576 at MPEG-2 and
//!   2.5) over its sample rate, frame by frame, after an ID3v2 tag.
//! - Audio it cannot read counts nothing (a provider would refuse it).

use base64::Engine;

/// Tokens of the `input_audio` part `audio` (`{"data": ..., "format": ...}`).
pub(super) fn tokens(audio: &serde_json::Value) -> u64 {
    let data = audio.get("data").and_then(serde_json::Value::as_str);
    let bytes = data.and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
    let Some(bytes) = bytes else { return 0 };
    let micros = match audio.get("format").and_then(serde_json::Value::as_str) {
        Some("wav") => wav_micros(&bytes),
        Some("mp3") => mp3_micros(&bytes),
        _ => None,
    };
    // Ten a second: one per 100,000 µs begun.
    micros.map_or(0, |us| us.div_ceil(100_000))
}

fn le16(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(
        bytes.get(at..at + 2)?.try_into().ok()?,
    )))
}

fn le32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A wav's duration in µs (rounded up).
fn wav_micros(bytes: &[u8]) -> Option<u64> {
    if bytes.get(..4)? != b"RIFF" || bytes.get(8..12)? != b"WAVE" {
        return None;
    }
    let mut at = 12;
    let mut per_second = None;
    while at + 8 <= bytes.len() {
        let size = le32(bytes, at + 4)? as usize;
        match bytes.get(at..at + 4)? {
            b"fmt " => {
                let channels = le16(bytes, at + 10)?;
                let rate = u64::from(le32(bytes, at + 12)?);
                let bits = le16(bytes, at + 22)?;
                per_second = Some(rate * channels * bits / 8);
            }
            b"data" => {
                let audio = (bytes.len() - at - 8) as u64;
                let per_second = per_second.filter(|p| *p > 0)?;
                return Some((audio * 1_000_000).div_ceil(per_second));
            }
            _ => {}
        }
        at += 8 + size + size % 2;
    }
    None
}

/// An mp3's duration in µs: its frames', each rounded up.
fn mp3_micros(bytes: &[u8]) -> Option<u64> {
    let mut at = 0;
    if bytes.get(..3)? == b"ID3" {
        let size = (bytes.get(6..10)?.iter()).fold(0, |n, b| n << 7 | usize::from(b & 0x7f));
        at = 10 + size;
    }
    let mut micros = 0;
    let mut frames = 0;
    while let Some((length, duration)) = bytes.get(at..at + 4).and_then(frame) {
        micros += duration;
        frames += 1;
        at += length;
    }
    (frames > 0).then_some(micros)
}

/// A Layer III frame's length in bytes and duration in µs, from its header.
fn frame(header: &[u8]) -> Option<(usize, u64)> {
    const KBPS_V1: [u32; 16] = [
        0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0,
    ];
    const KBPS_V2: [u32; 16] = [
        0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 0,
    ];
    const RATES_V1: [u32; 3] = [44_100, 48_000, 32_000];
    if header[0] != 0xff || header[1] & 0xe0 != 0xe0 || (header[1] >> 1) & 3 != 1 {
        return None;
    }
    let version = (header[1] >> 3) & 3;
    let divisor = match version {
        3 => 1,
        2 => 2,
        0 => 4,
        _ => return None,
    };
    let kbps = if version == 3 { KBPS_V1 } else { KBPS_V2 }[usize::from(header[2] >> 4)];
    let rate = *RATES_V1.get(usize::from((header[2] >> 2) & 3))? / divisor;
    if kbps == 0 {
        return None;
    }
    let samples = if version == 3 { 1_152 } else { 576 };
    let padding = usize::from((header[2] >> 1) & 1);
    let length = (samples / 8 * kbps as usize * 1_000) / rate as usize + padding;
    let micros = (samples as u64 * 1_000_000).div_ceil(u64::from(rate));
    Some((length, micros))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn part(bytes: &[u8], format: &str) -> serde_json::Value {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        json!({"data": data, "format": format})
    }

    #[test]
    fn a_wav_counts_ten_tokens_a_second() {
        // 16 kHz stereo 16-bit: 64,000 bytes a second; 2.5 s.
        let mut wav = b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x02\0".to_vec();
        wav.extend(16_000u32.to_le_bytes());
        wav.extend(64_000u32.to_le_bytes());
        wav.extend([4, 0, 16, 0]);
        wav.extend(b"data\0\0\0\0");
        wav.resize(wav.len() + 160_000, 0);
        assert_eq!(tokens(&part(&wav, "wav")), 25);
    }

    #[test]
    fn an_mp3_counts_its_frames() {
        // MPEG-2 Layer III, 64 kbit/s, 24 kHz: 576 samples (24 ms) in 192 bytes.
        let frame = [&[0xff, 0xf3, 0x84, 0x00][..], &[0u8; 188]].concat();
        assert_eq!(tokens(&part(&frame.repeat(100), "mp3")), 24, "2.4 s");
        assert_eq!(tokens(&part(b"not audio", "mp3")), 0);
        assert_eq!(tokens(&json!({"data": "%%%", "format": "wav"})), 0);
    }
}

//! An image's token cost from its size, when the request carries the image
//! itself (a `data:` URL): OpenAI's tile rule, for the models that count
//! images by 512 px tiles (gpt-4o, gpt-4.1, the o-series). The gateway fetches
//! no image, so one given by address is reserved the rule's bound
//! ([`super::IMAGE_HIGH_DETAIL_MOST_TOKENS`]).

use base64::Engine;

/// Most of a data URL's text decoded to find the image's size: a JPEG's size
/// follows its metadata, which is seldom longer (96 KiB of base64 is 72 KiB).
const MAX_HEADER_BASE64: usize = 96 * 1024;

/// The width and height of the image in a base64 `data:` URL, if its header
/// says them.
pub(super) fn data_url_size(url: &str) -> Option<(u64, u64)> {
    let (meta, data) = url.strip_prefix("data:")?.split_once(',')?;
    if !meta.ends_with(";base64") {
        return None;
    }
    base64_size(data)
}

/// The width and height of a base64 image, if its header says them.
pub(super) fn base64_size(data: &str) -> Option<(u64, u64)> {
    let prefix = &data.as_bytes()[..data.len().min(MAX_HEADER_BASE64)];
    let whole = &prefix[..prefix.len() / 4 * 4];
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(whole)
        .ok()?;
    let size = imagesize::blob_size(&bytes).ok()?;
    Some((size.width as u64, size.height as u64))
}

/// Anthropic's cost of a `width` x `height` image: width x height / 750,
/// after it is scaled down (aspect kept) to at most 1,568 px on its long side
/// and about 1.15 megapixels (1,092 x 1,092). Rounded up at every step, so it
/// never falls below the provider's figure by rounding.
pub(super) fn anthropic_tokens(width: u64, height: u64) -> u64 {
    const LONG_SIDE: f64 = 1_568.0;
    const AREA: f64 = 1_092.0 * 1_092.0;
    let (mut w, mut h) = (width.max(1) as f64, height.max(1) as f64);
    let longest = w.max(h);
    if longest > LONG_SIDE {
        (w, h) = (w * LONG_SIDE / longest, h * LONG_SIDE / longest);
    }
    if w * h > AREA {
        let scale = (AREA / (w * h)).sqrt();
        (w, h) = (w * scale, h * scale);
    }
    let tokens = (w.ceil() * h.ceil() / 750.0).ceil() as u64;
    tokens.min(super::ANTHROPIC_IMAGE_MOST_TOKENS)
}

/// The 32 px patches covering a `width` x `height` image, at most
/// [`super::IMAGE_MOST_PATCHES`] (OpenAI scales a larger image down to fit
/// that many, which never takes more).
pub(super) fn patches(width: u64, height: u64) -> u64 {
    let covering = width.max(1).div_ceil(32) * height.max(1).div_ceil(32);
    covering.min(super::IMAGE_MOST_PATCHES)
}

/// OpenAI's high-detail cost of a `width` x `height` image: scaled to fit
/// 2048 x 2048, then down to 768 px on its short side, 170 tokens per 512 px
/// tile of that, plus 85.
pub(super) fn openai_tiles_tokens(width: u64, height: u64) -> u64 {
    let (mut w, mut h) = (width.max(1) as f64, height.max(1) as f64);
    let longest = w.max(h);
    if longest > 2048.0 {
        (w, h) = (w * 2048.0 / longest, h * 2048.0 / longest);
    }
    let shortest = w.min(h);
    if shortest > 768.0 {
        (w, h) = (w * 768.0 / shortest, h * 768.0 / shortest);
    }
    let tiles = (w / 512.0).ceil() as u64 * (h / 512.0).ceil() as u64;
    85 + 170 * tiles
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG of `width` x `height`: its signature and header chunk (what the
    /// size is read from).
    fn png(width: u32, height: u32) -> String {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        bytes.extend_from_slice(&width.to_be_bytes());
        bytes.extend_from_slice(&height.to_be_bytes());
        bytes.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        format!("data:image/png;base64,{data}")
    }

    #[test]
    fn a_data_urls_size_is_read_and_costed_by_the_tile_rule() {
        assert_eq!(data_url_size(&png(1024, 1024)), Some((1024, 1024)));
        assert_eq!(data_url_size("https://example.com/a.png"), None);
        assert_eq!(data_url_size("data:image/png;base64,!!!!"), None);
        // OpenAI's published examples: 1024 x 1024 is 4 tiles (765 tokens),
        // 2048 x 4096 is scaled to 768 x 1536, 6 tiles (1,105).
        assert_eq!(openai_tiles_tokens(1024, 1024), 765);
        assert_eq!(openai_tiles_tokens(2048, 4096), 1_105);
        assert_eq!(openai_tiles_tokens(100, 100), 255);
        assert!(openai_tiles_tokens(2048, 768) <= super::super::IMAGE_HIGH_DETAIL_MOST_TOKENS);
    }

    #[test]
    fn patch_models_cost_32_px_patches_times_their_multiplier() {
        use super::super::ImageRule;
        let mini = ImageRule::for_model("gpt-4.1-mini-2025-04-14");
        assert_eq!(mini, ImageRule::Patches { per_mille: 1_620 });
        assert_eq!(ImageRule::for_model("gpt-4.1"), ImageRule::Tiles);
        // OpenAI's example: 1024 x 1024 is 32 x 32 = 1,024 patches.
        assert_eq!(patches(1024, 1024), 1_024);
        assert_eq!(mini.tokens(None, Some(&png(1024, 1024))), 1_659);
        // A larger image is scaled to at most 1,536 patches; by address, the
        // most one costs, whatever its detail.
        assert_eq!(patches(1800, 2400), 1_536);
        assert_eq!(mini.tokens(Some("low"), Some("https://e.com/a.png")), 2_489);
        let nano = ImageRule::for_model("gpt-4.1-nano");
        assert_eq!(nano.tokens(None, None), 3_779);
    }

    #[test]
    fn anthropic_images_cost_their_area_over_750_within_the_size_limits() {
        // Anthropic's published figures: 200 x 200 about 54 tokens, 1000 x 1000
        // about 1,334, 1092 x 1092 about 1,590 (the most).
        assert_eq!(anthropic_tokens(200, 200), 54);
        assert_eq!(anthropic_tokens(1000, 1000), 1_334);
        assert_eq!(anthropic_tokens(1092, 1092), 1_590);
        assert!(anthropic_tokens(4000, 3000) <= 1_600);
        assert!(anthropic_tokens(8000, 100) <= 1_600);
        let data = png(800, 600)
            .trim_start_matches("data:image/png;base64,")
            .to_owned();
        assert_eq!(base64_size(&data), Some((800, 600)));
    }
}

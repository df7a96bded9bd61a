//! Entry points for the fuzz targets (`fuzz/targets.rs`) into what the crate
//! keeps to itself; hidden from the docs.

/// Decodes a statement batch as the internal RPC does and converts each entry
/// to the request an owner's line takes: `Some(buckets stated in all)`, or
/// `None` for a body the RPC refuses as malformed.
pub fn decode_statements(body: &[u8]) -> Option<usize> {
    let batch: crate::sync::lease::wire::Batch = serde_json::from_slice(body).ok()?;
    Some(batch.entries.iter().map(|e| e.request().usage.len()).sum())
}

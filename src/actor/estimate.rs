//! Adaptive completion estimates (policy `adaptive`): per model, the p95 of the last
//! [`SAMPLES`] completion lengths times a headroom factor, capped by the request's
//! max_tokens. Until enough completions are seen, the estimate is max_tokens. Owned
//! by the tenant actor, so it needs no lock. Bounded: at most [`MAX_MODELS`] models
//! per tenant, the least recently updated one is forgotten first.

use std::collections::HashMap;
use std::sync::Arc;

/// Completion lengths remembered per model.
pub const SAMPLES: usize = crate::config::bounds::ADAPTIVE_SAMPLES;
/// Models remembered per tenant.
pub const MAX_MODELS: usize = 64;

/// Settings of the adaptive policy.
#[derive(Clone, Copy, Debug)]
pub struct AdaptivePolicy {
    /// Multiplier on the p95.
    pub headroom: f64,
    /// Completions needed before the p95 is trusted.
    pub min_samples: usize,
}

#[derive(Debug, Default)]
struct ModelStats {
    ring: Vec<u32>,
    next: usize,
    p95: u64,
    last_update: u64,
}

impl ModelStats {
    fn record(&mut self, completion: u64, tick: u64) {
        let value = u32::try_from(completion).unwrap_or(u32::MAX);
        if self.ring.len() < SAMPLES {
            self.ring.push(value);
        } else {
            self.ring[self.next] = value;
        }
        self.next = (self.next + 1) % SAMPLES;
        self.last_update = tick;
        let mut sorted = self.ring.clone();
        let rank = (sorted.len() * 95).div_ceil(100).saturating_sub(1);
        let (_, p95, _) = sorted.select_nth_unstable(rank);
        self.p95 = u64::from(*p95);
    }
}

/// Per-model completion statistics of one tenant.
#[derive(Debug, Default)]
pub struct CompletionStats {
    models: HashMap<Arc<str>, ModelStats>,
    tick: u64,
}

impl CompletionStats {
    /// Remembers one real completion length.
    pub fn record(&mut self, model: &Arc<str>, completion: u64) {
        self.tick += 1;
        if !self.models.contains_key(model) && self.models.len() >= MAX_MODELS {
            let oldest = self
                .models
                .iter()
                .min_by_key(|(_, s)| s.last_update)
                .map(|(m, _)| m.clone());
            if let Some(oldest) = oldest {
                self.models.remove(&oldest);
            }
        }
        self.models
            .entry(model.clone())
            .or_default()
            .record(completion, self.tick);
    }

    /// Completion tokens to reserve for a request allowing `max_tokens`.
    pub fn estimate(&self, model: &str, max_tokens: u64, policy: AdaptivePolicy) -> u64 {
        match self.models.get(model) {
            Some(stats) if stats.ring.len() >= policy.min_samples => {
                let adaptive = (stats.p95 as f64 * policy.headroom).ceil() as u64;
                adaptive.clamp(1, max_tokens.max(1))
            }
            _ => max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: AdaptivePolicy = AdaptivePolicy {
        headroom: 1.2,
        min_samples: 20,
    };

    #[test]
    fn max_tokens_until_enough_samples_then_p95_times_headroom() {
        let model: Arc<str> = "m".into();
        let mut stats = CompletionStats::default();
        for i in 0..19 {
            stats.record(&model, 100 + i);
        }
        assert_eq!(stats.estimate("m", 4096, POLICY), 4096);
        for i in 0..81 {
            stats.record(&model, 100 + (i % 10));
        }
        // 100 samples: 19 in 100..=118, 81 in 100..=109; p95 is 114 -> x1.2 = 136.8.
        let estimate = stats.estimate("m", 4096, POLICY);
        assert!((120..=143).contains(&estimate), "{estimate}");
        assert_eq!(
            stats.estimate("m", 50, POLICY),
            50,
            "never above max_tokens"
        );
        assert_eq!(stats.estimate("other", 300, POLICY), 300);
    }

    #[test]
    fn model_map_is_bounded() {
        let mut stats = CompletionStats::default();
        for i in 0..(MAX_MODELS + 10) {
            stats.record(&Arc::from(format!("m{i}")), 1);
        }
        assert_eq!(stats.models.len(), MAX_MODELS);
        assert!(stats.models.contains_key(&*format!("m{}", MAX_MODELS + 9)));
    }
}

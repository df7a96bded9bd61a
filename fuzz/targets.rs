//! The fuzz targets' bodies, one function per target, each taking the raw
//! input. `fuzz_targets/*.rs` hand them to libFuzzer (`cargo fuzz run`,
//! nightly); the main test suite replays each target's corpus and mutations
//! of it through the same functions on stable (`tests/it/fuzz_corpus.rs`).
//! A target fails by panicking.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::limiter::{Algorithm, Ceiling, Denial, LimitSpec, Limiter, Reservation};
use tollgate::proxy::request::{Api, ParseSettings, parse};
use tollgate::proxy::stream::SseScanner;
use tollgate::proxy::usage::UsageBound;
use tollgate::tokens::{Encoding, TokenCounter};
use tollgate_cluster::auth::ClusterKeys;
use tollgate_cluster::auth::frame::{Opener, Sealer};
use tollgate_cluster::auth::keys::Channel;
use tollgate_cluster::auth::rpc::{Request, RpcVerifier};
use tollgate_cluster::chitchat::ChitchatEnvelope;
use tollgate_cluster::counter::archive::decode_archive;
use tollgate_cluster::counter::codec::decode;
use tollgate_cluster::counter::{Window, Windows};

/// A target: it fails by panicking.
pub(crate) type Target = fn(&[u8]);

/// Every target, by name (the corpus directories' names).
pub(crate) const TARGETS: [(&str, Target); 5] = [
    ("request", request),
    ("sse", sse),
    ("cluster_wire", cluster_wire),
    ("config", config),
    ("limiter", limiter),
];

/// Request parsing and estimation. Input: the API (first byte), then a body.
/// Never panics; a body that parses gives the same estimate twice.
pub(crate) fn request(input: &[u8]) {
    let [which, body @ ..] = input else {
        return;
    };
    let api = Api::ALL[usize::from(*which) % Api::ALL.len()];
    let encoding = Encoding::for_openai_model("gpt-4o-mini").expect("known model");
    let settings = ParseSettings {
        default_max_tokens: 4096,
    };
    let counter = |_: &str| Ok(TokenCounter::from(encoding));
    let first = parse(api, Bytes::copy_from_slice(body), settings, counter);
    let again = parse(api, Bytes::copy_from_slice(body), settings, counter);
    match (first, again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.prompt_tokens, b.prompt_tokens, "estimates differ");
            assert_eq!(a.max_completion_tokens, b.max_completion_tokens);
            assert_eq!(a.usage_bound, b.usage_bound);
            let _ = UsageBound::of(a.prompt_tokens, a.max_completion_tokens, body);
        }
        (Err(_), Err(_)) => {}
        _ => panic!("a body parsed once and not the other time"),
    }
}

/// SSE usage extraction. Input: the API (first byte), whether to strip the
/// usage chunk (second byte's low bit), the chunk size (third byte, 1-256),
/// then the upstream's stream. Never panics; without stripping the client gets
/// exactly what the upstream sent; the scan's cost is linear in the stream.
pub(crate) fn sse(input: &[u8]) {
    const APIS: [Api; 4] = [Api::Chat, Api::Completions, Api::Messages, Api::Responses];
    let [which, strip, size, stream @ ..] = input else {
        return;
    };
    let api = APIS[usize::from(*which) % APIS.len()];
    let strip = strip & 1 == 1;
    let mut scanner = SseScanner::default();
    let mut out = Vec::with_capacity(stream.len());
    for chunk in stream.chunks(usize::from(*size) + 1) {
        out.extend_from_slice(&scanner.feed(chunk, api, strip));
    }
    out.extend_from_slice(&scanner.rest(api, strip));
    if !strip {
        assert_eq!(out, stream, "the stream was altered");
    }
    assert!(out.len() <= stream.len());
    let _ = scanner.settlement();
    assert!(
        scanner.examined() <= 2 * stream.len() as u64 + 64,
        "{} bytes examined for a {}-byte stream",
        scanner.examined(),
        stream.len()
    );
}

/// What peers send. Input: a gossiped key, 0xff, its value, 0xff, then bytes
/// read as a chitchat envelope, a statement batch, a sealed datagram and (the
/// key) an RPC tag. Never panics; nothing opens or verifies under a key the
/// input cannot hold, while what is sealed with it opens once.
pub(crate) fn cluster_wire(input: &[u8]) {
    const NOW: u64 = 1_700_000_000_000;
    const SECRET: &str = "fuzz-cluster-secret-0123";
    let mut parts = input.splitn(3, |b| *b == 0xff);
    let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
        return;
    };
    let bytes = parts.next().unwrap_or_default();
    let (key, value) = (String::from_utf8_lossy(key), String::from_utf8_lossy(value));
    let base = Window::try_new(60_000, 60).expect("window");
    let day = Window::try_new(86_400_000, 24).expect("window");
    let windows = Windows::new(base, day);
    let _ = decode(&key, &value, &windows);
    let _ = decode_archive(&key, &value, &windows);
    let mut read = bytes;
    let _ = ChitchatEnvelope::deserialize(&mut read);
    let _ = tollgate::fuzzing::decode_statements(bytes);

    let keys = ClusterKeys::new("c", SECRET, &[], Channel::Gossip).expect("keys");
    let keys = Arc::new(keys);
    let mut opener = Opener::new(keys.clone());
    assert!(opener.open(bytes, NOW).is_err(), "a forged datagram opened");
    if let Some(sealed) = Sealer::new(keys, 7).seal(bytes, NOW) {
        assert_eq!(opener.open(&sealed, NOW), Ok(bytes));
        assert!(
            opener.open(&sealed, NOW).is_err(),
            "a datagram opened twice"
        );
    }
    let rpc_keys = ClusterKeys::new("c", SECRET, &[], Channel::Rpc).expect("keys");
    let request = Request {
        to: "10.0.0.1:7300",
        path: "/internal/v1/lease/sync",
        headers: &[("x-tollgate-cluster-id", b"c")],
        body: value.as_bytes(),
    };
    let verdict = RpcVerifier::new(rpc_keys).verify(Some(key.as_bytes()), &request, NOW);
    assert!(verdict.is_err(), "a forged RPC tag verified");
}

/// Config parsing: any text as a config file (`${SET}` set, every other
/// variable unset). Never panics; the same text gets the same verdict twice.
pub(crate) fn config(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let env = |name: &str| (name == "SET").then(|| "value-of-sixteen-plus".to_owned());
    let first = Config::from_toml_with_env(text, "fuzz.toml", &env);
    let again = Config::from_toml_with_env(text, "fuzz.toml", &env);
    assert_eq!(first.is_ok(), again.is_ok());
}

/// The sliding-window limiter against a reference model: a map of bucket to
/// cost, each bucket counting until `(b + 1) * width + window`. Input: the
/// capacity, the bucket count (1-8) and width, then steps of two bytes (a
/// clock step, a reserve, or a settlement). Its decisions (admit, the exact
/// retry-after, never), count and settlements match the model's.
pub(crate) fn limiter(input: &[u8]) {
    let [capacity, buckets, width, steps @ ..] = input else {
        return;
    };
    let capacity = u64::from((*capacity).max(1));
    let buckets = u32::from(buckets % 8 + 1);
    let width = u64::from((*width).max(1));
    let window = width * u64::from(buckets);
    let spec = LimitSpec {
        buckets,
        ..LimitSpec::new(capacity, window, Algorithm::SlidingWindow)
    };
    let mut limiter = Limiter::try_new(spec).expect("valid spec");
    let mut model = Model {
        capacity,
        width,
        window,
        buckets: BTreeMap::new(),
    };
    let mut now = 0u64;
    let mut open: Vec<Reservation> = Vec::new();
    for step in steps.chunks_exact(2) {
        let (kind, arg) = (step[0], step[1]);
        match kind % 3 {
            0 => now += u64::from(arg) * u64::from(kind / 3 + 1),
            1 => {
                let cost = u64::from(arg);
                let expected = model.decide(now, cost);
                let got = limiter.reserve(now, cost, Ceiling::FULL);
                let decision = got.as_ref().map(|_| ()).map_err(|denial| *denial);
                assert_eq!(decision, expected, "at {now}, cost {cost}");
                if let Ok(reservation) = got {
                    *model.buckets.entry(now / width).or_default() += cost;
                    open.push(reservation);
                }
            }
            _ if open.is_empty() => {}
            _ => {
                let reservation = open.swap_remove(usize::from(kind / 3) % open.len());
                model.settle(&mut limiter, now, reservation, u64::from(arg));
            }
        }
        assert_eq!(limiter.snapshot(now).used, model.used(now), "at {now}");
    }
}

/// The limiter's reference model.
struct Model {
    capacity: u64,
    width: u64,
    window: u64,
    buckets: BTreeMap<u64, u64>,
}

impl Model {
    fn live(&self, bucket: u64, now: u64) -> bool {
        (bucket + 1) * self.width + self.window > now
    }

    fn used(&self, now: u64) -> u64 {
        (self.buckets.iter())
            .filter(|(b, _)| self.live(**b, now))
            .map(|(_, c)| c)
            .sum()
    }

    fn decide(&self, now: u64, cost: u64) -> Result<(), Denial> {
        if cost > self.capacity {
            return Err(Denial::Never);
        }
        let used = self.used(now);
        if used + cost <= self.capacity {
            return Ok(());
        }
        let mut left = used;
        for (bucket, charged) in self.buckets.iter().filter(|(b, _)| self.live(**b, now)) {
            left -= charged;
            if *charged > 0 && left + cost <= self.capacity {
                let leaves = (bucket + 1) * self.width + self.window;
                return Err(Denial::RetryAfter((leaves - now).max(1)));
            }
        }
        panic!("the model's count is not explained by its buckets")
    }

    /// Settles `reservation` at `actual` on the limiter and the model, and
    /// checks they agree.
    fn settle(&mut self, limiter: &mut Limiter, now: u64, reservation: Reservation, actual: u64) {
        let (bucket, cost) = (reservation.slot, reservation.cost);
        let settlement = limiter.settle(now, reservation, actual);
        if !self.live(bucket, now) {
            assert_eq!(settlement.expired, cost.abs_diff(actual), "at {now}");
            return;
        }
        let slot = self.buckets.entry(bucket).or_default();
        if actual <= cost {
            let refund = (cost - actual).min(*slot);
            assert_eq!(settlement.refunded, refund, "at {now}");
            *slot -= refund;
        } else {
            assert_eq!(settlement.debt, actual - cost, "at {now}");
            *slot += actual - cost;
        }
    }
}

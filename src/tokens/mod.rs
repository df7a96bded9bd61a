//! Token counting for the gateway's estimates: the rule OpenAI documents for
//! chat prompts, tool calls and results, definitions (tools, schemas) by their
//! JSON text, images by a bound (docs/design/estimates.md).
//!
//! Chat prompts cost `3` tokens of framing per message, `1` more when a message has a
//! `name`, the tokens of every text part, and `3` tokens that prime the reply (the
//! OpenAI cookbook, "How to count tokens with tiktoken"). Models tiktoken does not know
//! use a configured [`Encoding`], which may be a characters-per-token ratio.
//!
//! The gateway counts BPE tokens with [`bpe::BpeCounter`], tiktoken's pattern
//! and merge on the `regex` crate's engine (0.19-0.42x tiktoken-rs's time,
//! docs/BENCHMARKS.md), with counts equal to tiktoken-rs's. The mock
//! upstream counts on its own (`crate::mock`'s `count`, tiktoken-rs and the
//! providers' rules): it plays the provider, whose counts are the ground
//! truth the gateway's estimates are judged by, so they do not come from the
//! code under test.
//! Each encoding's tables load once per process, all at a node's start (~250 ms).

pub mod audio;
mod bpe;
mod image;
mod memo;
mod responses;

use crate::config::bounds::EncodingName;
use bpe::BpeCounter;
pub use memo::{COUNT_MEMO_SLOTS_RANGE, CountMemo, MIN_MEMO_BYTES};
pub use responses::count_responses_prompt;
use serde::Deserialize;
use std::sync::OnceLock;
use tiktoken_rs::tokenizer::Tokenizer;

/// Framing tokens per chat message (OpenAI cookbook, current models).
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra tokens when a message carries a `name`.
pub const TOKENS_PER_NAME: u64 = 1;
/// Tokens that prime the assistant's reply, counted once per prompt.
pub const REPLY_PRIMING_TOKENS: u64 = 3;
/// Flat cost charged for a content part the gateway does not measure (a
/// file, a type it does not know).
pub const NON_TEXT_PART_TOKENS: u64 = 85;

/// An OpenAI image at `detail: low`: one 512 px tile's worth, whatever its size.
pub const IMAGE_LOW_DETAIL_TOKENS: u64 = 85;

/// The most an OpenAI image at high (or automatic) detail costs: scaled into
/// 2048 x 2048 and to 768 px on its short side, 2048 x 768 is 4 x 2 tiles of
/// 170 tokens, plus 85. The gateway does not fetch or decode the image, so it
/// reserves this bound; the settlement charges what the provider counted.
pub const IMAGE_HIGH_DETAIL_MOST_TOKENS: u64 = 85 + 170 * 8;

/// Anthropic's tool-use system prompt, added to the input once a request
/// defines tools (its documented figure for `tool_choice` `auto` or `none`,
/// the larger of two).
pub const ANTHROPIC_TOOL_PROMPT_TOKENS: u64 = 346;

/// The most an image costs at Anthropic (width x height / 750 at the largest
/// size it keeps, about 1.15 megapixels).
pub const ANTHROPIC_IMAGE_MOST_TOKENS: u64 = 1_600;

/// An image's reservation by its `detail` and, when the request carries the
/// image (a `data:` URL), its size (OpenAI's tile rule); else the rule's bound.
pub fn openai_image_tokens(detail: Option<&str>, url: Option<&str>) -> u64 {
    ImageRule::Tiles.tokens(detail, url)
}

/// Most 32 px patches an image costs on the patch rule.
pub const IMAGE_MOST_PATCHES: u64 = 1_536;

/// How an OpenAI model counts an image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageRule {
    /// 170 per 512 px tile plus 85 (gpt-4o, gpt-4.1, the o-series but o4-mini).
    #[default]
    Tiles,
    /// One per 32 px patch, at most [`IMAGE_MOST_PATCHES`], times the model's
    /// multiplier in thousandths (gpt-4.1-mini and gpt-5-mini 1.62,
    /// gpt-4.1-nano and gpt-5-nano 2.46, o4-mini 1.72).
    Patches {
        /// The multiplier, in thousandths.
        per_mille: u64,
    },
}

impl ImageRule {
    /// The rule of `model` (by OpenAI's published list; tiles otherwise).
    pub fn for_model(model: &str) -> ImageRule {
        let per_mille = [
            ("gpt-4.1-mini", 1_620),
            ("gpt-5-mini", 1_620),
            ("gpt-4.1-nano", 2_460),
            ("gpt-5-nano", 2_460),
            ("o4-mini", 1_720),
        ]
        .into_iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map(|(_, m)| m);
        per_mille.map_or(ImageRule::Tiles, |per_mille| ImageRule::Patches {
            per_mille,
        })
    }

    /// An image's reservation by its `detail` and, when the request carries
    /// the image (a `data:` URL), its size; else the rule's bound. The patch
    /// rule ignores `detail` (its models do not document one).
    pub fn tokens(self, detail: Option<&str>, url: Option<&str>) -> u64 {
        let size = url.and_then(image::data_url_size);
        match (self, detail, size) {
            (ImageRule::Tiles, Some("low"), _) => IMAGE_LOW_DETAIL_TOKENS,
            (ImageRule::Tiles, _, Some((w, h))) => image::openai_tiles_tokens(w, h),
            (ImageRule::Tiles, _, None) => IMAGE_HIGH_DETAIL_MOST_TOKENS,
            (ImageRule::Patches { per_mille }, _, size) => {
                let patches = size.map_or(IMAGE_MOST_PATCHES, |(w, h)| image::patches(w, h));
                (patches * per_mille).div_ceil(1_000)
            }
        }
    }
}

/// How text turns into tokens for one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Encoding {
    /// OpenAI's `cl100k_base` (gpt-4, gpt-3.5-turbo, text-embedding-3-*).
    Cl100kBase,
    /// OpenAI's `o200k_base` (gpt-4o, gpt-4.1, o-series, gpt-5).
    O200kBase,
    /// Characters per token, for models with no public tokenizer (e.g. Claude).
    /// Rounded up, so a short text never counts as zero.
    CharsPerToken(f32),
}

impl Encoding {
    /// The encoding tiktoken uses for `model`, if it knows the model.
    pub fn for_openai_model(model: &str) -> Option<Encoding> {
        match tiktoken_rs::tokenizer::get_tokenizer(model)? {
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => Some(Encoding::O200kBase),
            Tokenizer::Cl100kBase => Some(Encoding::Cl100kBase),
            // Older completion models: cl100k over-counts them slightly, which is the
            // safe direction for a limiter.
            _ => Some(Encoding::Cl100kBase),
        }
    }

    /// Parses a configured encoding name: `cl100k_base`, `o200k_base`, or
    /// `chars-per-token:<ratio>`.
    pub fn parse(name: &str) -> Result<Encoding, String> {
        Ok(match EncodingName::parse(name)? {
            EncodingName::Cl100kBase => Encoding::Cl100kBase,
            EncodingName::O200kBase => Encoding::O200kBase,
            EncodingName::CharsPerToken(ratio) => Encoding::CharsPerToken(ratio),
        })
    }

    /// Tokens in `text` (special tokens are counted as plain text, as the API does for
    /// user content).
    pub fn count_text(self, text: &str) -> u64 {
        let bpe = match self {
            Encoding::Cl100kBase => CL100K.get_or_init(BpeCounter::cl100k_base),
            Encoding::O200kBase => O200K.get_or_init(BpeCounter::o200k_base),
            Encoding::CharsPerToken(ratio) => return count_by_ratio(text, ratio),
        };
        bpe.count(text) as u64
    }

    /// The most bytes one token holds: a text of `n` bytes has at least
    /// `n / longest_token_bytes()` tokens (for a ratio, four bytes per
    /// character at most).
    pub fn longest_token_bytes(self) -> u64 {
        let bpe = match self {
            Encoding::Cl100kBase => CL100K.get_or_init(BpeCounter::cl100k_base),
            Encoding::O200kBase => O200K.get_or_init(BpeCounter::o200k_base),
            Encoding::CharsPerToken(ratio) => {
                return (f64::from(ratio) * 4.0).ceil().max(1.0) as u64;
            }
        };
        bpe.longest_token_bytes() as u64
    }

    /// Tokens in `text` as tiktoken-rs counts them: the mock upstream's
    /// counts. Equal to [`Encoding::count_text`] (tested), by other code.
    pub fn count_text_reference(self, text: &str) -> u64 {
        let bpe = match self {
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::CharsPerToken(ratio) => return count_by_ratio(text, ratio),
        };
        bpe.count_ordinary(text) as u64
    }

    /// Tokens in a message's `role`. Every chat message has one and nearly all
    /// are one of [`COMMON_ROLES`], whose counts each BPE encoding works out
    /// once, from its own tables: a count per message (~40 ns for `user`,
    /// `cargo bench --bench request`) becomes a lookup in six.
    /// Other roles are counted every time, never through the count memo: a
    /// role is no client's long repeated text, and a client inventing long
    /// roles pays what the same text as content costs.
    pub fn count_role(self, role: &str) -> u64 {
        static CL100K: OnceLock<[u64; COMMON_ROLES.len()]> = OnceLock::new();
        static O200K: OnceLock<[u64; COMMON_ROLES.len()]> = OnceLock::new();
        let table = match self {
            Encoding::Cl100kBase => &CL100K,
            Encoding::O200kBase => &O200K,
            Encoding::CharsPerToken(_) => return self.count_text(role),
        };
        match COMMON_ROLES.iter().position(|common| *common == role) {
            Some(i) => table.get_or_init(|| COMMON_ROLES.map(|r| self.count_text(r)))[i],
            None => self.count_text(role),
        }
    }

    /// Loads every BPE encoding's tables now, both at once, so that no request
    /// pays for them. A node serves whatever model its clients name, so loading
    /// only the default encoding left the first request for the other one
    /// (gpt-4o beside gpt-4, say) to load its tables (~250 ms here) on its worker
    /// thread, stalling every request queued behind it.
    pub fn warm_up_every_bpe() {
        std::thread::scope(|scope| {
            scope.spawn(|| Encoding::Cl100kBase.warm_up());
            Encoding::O200kBase.warm_up();
        });
    }

    /// Has this process loaded the encoding's tables? (Always true for a ratio.)
    pub fn is_loaded(self) -> bool {
        match self {
            Encoding::Cl100kBase => CL100K.get().is_some(),
            Encoding::O200kBase => O200K.get().is_some(),
            Encoding::CharsPerToken(_) => true,
        }
    }

    /// Loads the encoding's tables and its roles' counts.
    pub fn warm_up(self) {
        let _ = self.count_role(COMMON_ROLES[0]);
    }

    /// Loads tiktoken-rs's tables for [`Encoding::count_text_reference`].
    pub fn warm_up_reference(self) {
        let _ = self.count_text_reference("");
    }
}

/// The gateway's counter for each BPE encoding, loaded once per process
/// ([`Encoding::warm_up_every_bpe`]).
static CL100K: OnceLock<BpeCounter> = OnceLock::new();
static O200K: OnceLock<BpeCounter> = OnceLock::new();

/// Characters over `ratio`, rounded up, so a short text never counts as zero.
fn count_by_ratio(text: &str, ratio: f32) -> u64 {
    let chars = text.chars().count() as f64;
    (chars / f64::from(ratio)).ceil() as u64
}

/// The chat roles [`Encoding::count_role`] counts once per encoding.
pub const COMMON_ROLES: [&str; 6] = [
    "system",
    "user",
    "assistant",
    "tool",
    "developer",
    "function",
];

/// Counts texts under one encoding: through a node's [`CountMemo`] for one
/// tenant (the gateway's estimates), or without one (an [`Encoding`] is such a
/// counter).
#[derive(Clone, Copy)]
pub struct TokenCounter<'a> {
    encoding: Encoding,
    how: Counting<'a>,
    images: ImageRule,
    budget: Option<&'a CountBudget>,
}

/// The most text tokens worth counting for one request: past it the request
/// is refused whatever the rest counts (its input alone exceeds a limit of
/// its tenant), so the rest is costed by its length, which is above its
/// tokens, without tokenising it. A 4 MB prompt for a tenant limited to
/// 20,000 tokens a minute is refused after at most that many tokens'
/// counting, not after all of it.
#[derive(Debug)]
pub struct CountBudget {
    left: std::sync::atomic::AtomicU64,
}

impl CountBudget {
    /// A budget of `tokens`.
    pub fn new(tokens: u64) -> CountBudget {
        CountBudget {
            left: std::sync::atomic::AtomicU64::new(tokens),
        }
    }

    /// `Some(an upper bound of its tokens)` when `text` need not be counted:
    /// the budget is spent, or the text alone has more tokens than it leaves
    /// (at least its length over the encoding's longest token).
    fn skip(&self, text: &str, longest: u64) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let left = self.left.load(Relaxed);
        let at_least = (text.len() as u64).div_ceil(longest.max(1));
        if at_least > left || (left == 0 && !text.is_empty()) {
            self.left.store(0, Relaxed);
            return Some(text.len() as u64);
        }
        None
    }

    fn spend(&self, tokens: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let left = self.left.load(Relaxed);
        self.left.store(left.saturating_sub(tokens), Relaxed);
    }
}

#[derive(Clone, Copy)]
enum Counting<'a> {
    Direct,
    Memoized(&'a CountMemo, &'a str),
}

impl From<Encoding> for TokenCounter<'_> {
    fn from(encoding: Encoding) -> Self {
        TokenCounter {
            encoding,
            how: Counting::Direct,
            images: ImageRule::Tiles,
            budget: None,
        }
    }
}

impl<'a> TokenCounter<'a> {
    /// Counts through `memo`, its entries scoped to `tenant`.
    pub fn memoized(encoding: Encoding, memo: &'a CountMemo, tenant: &'a str) -> Self {
        TokenCounter {
            encoding,
            how: Counting::Memoized(memo, tenant),
            images: ImageRule::Tiles,
            budget: None,
        }
    }

    /// The same counter, counting at most `budget`'s tokens of text
    /// ([`CountBudget`]).
    pub fn with_budget(mut self, budget: &'a CountBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The same counter, costing OpenAI images by `rule` (the model's).
    pub fn with_images(mut self, rule: ImageRule) -> Self {
        self.images = rule;
        self
    }

    /// An OpenAI image's tokens, by the model's rule.
    pub fn image_tokens(self, detail: Option<&str>, url: Option<&str>) -> u64 {
        self.images.tokens(detail, url)
    }

    /// Tokens in a message's `role` (never memoized: [`Encoding::count_role`]
    /// already knows the common ones).
    pub fn count_role(self, role: &str) -> u64 {
        match self.how {
            Counting::Direct | Counting::Memoized(..) => self.encoding.count_role(role),
        }
    }

    /// Tokens in `text` (past the budget, its length: more).
    pub fn count_text(self, text: &str) -> u64 {
        if let Some(budget) = self.budget
            && let Some(bound) = budget.skip(text, self.encoding.longest_token_bytes())
        {
            return bound;
        }
        let tokens = match self.how {
            Counting::Direct => self.encoding.count_text(text),
            Counting::Memoized(memo, tenant) => memo.count(tenant, self.encoding, text),
        };
        if let Some(budget) = self.budget {
            budget.spend(tokens);
        }
        tokens
    }
}

/// One chat message as far as counting needs it; every other field is ignored.
#[derive(Debug, Deserialize)]
pub struct ChatMessage<'a> {
    /// `system`, `user`, `assistant`, `tool`, ...
    #[serde(borrow)]
    pub role: std::borrow::Cow<'a, str>,
    /// Text or a list of parts; absent on assistant messages that only call tools.
    #[serde(default, borrow)]
    pub content: Option<Content<'a>>,
    /// Optional participant name (costs [`TOKENS_PER_NAME`]).
    #[serde(default, borrow)]
    pub name: Option<std::borrow::Cow<'a, str>>,
    /// An assistant message's tool calls: each costs its function's name and
    /// arguments.
    #[serde(default, borrow)]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
    /// The legacy single function call of an assistant message.
    #[serde(default, borrow)]
    pub function_call: Option<FunctionCall<'a>>,
}

/// One tool call of an assistant message.
#[derive(Debug, Deserialize)]
pub struct ToolCall<'a> {
    /// The function called (absent for other tool types, counted as nothing).
    #[serde(default, borrow)]
    pub function: Option<FunctionCall<'a>>,
}

/// A function call: its name and its arguments (a JSON text).
#[derive(Debug, Deserialize)]
pub struct FunctionCall<'a> {
    /// The function's name.
    #[serde(default, borrow)]
    pub name: Option<std::borrow::Cow<'a, str>>,
    /// Its arguments, as the JSON text the model wrote.
    #[serde(default, borrow)]
    pub arguments: Option<std::borrow::Cow<'a, str>>,
}

impl FunctionCall<'_> {
    /// Its name and arguments, after the framing of a call.
    fn count(&self, counter: TokenCounter<'_>) -> u64 {
        let text = |t: &Option<std::borrow::Cow<'_, str>>| {
            t.as_deref().map_or(0, |t| counter.count_text(t))
        };
        TOKENS_PER_MESSAGE + text(&self.name) + text(&self.arguments)
    }
}

/// Message content: a plain string or a list of typed parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content<'a> {
    /// `"content": "hello"`.
    #[serde(borrow)]
    Text(std::borrow::Cow<'a, str>),
    /// `"content": [{"type":"text","text":"hello"}, {"type":"image_url",...}]`.
    #[serde(borrow)]
    Parts(Vec<ContentPart<'a>>),
}

/// One part of a multi-part message.
#[derive(Debug, Deserialize)]
pub struct ContentPart<'a> {
    /// `text` for text parts; `tool_use` and `tool_result` (Anthropic) by what
    /// they carry; images by [`openai_image_tokens`] or
    /// [`ANTHROPIC_IMAGE_MOST_TOKENS`]; audio by its length
    /// ([`audio::input_audio_tokens`]); anything else is charged
    /// [`NON_TEXT_PART_TOKENS`].
    #[serde(rename = "type", borrow)]
    pub kind: std::borrow::Cow<'a, str>,
    /// The text of a `text` part.
    #[serde(default, borrow)]
    pub text: Option<std::borrow::Cow<'a, str>>,
    /// A `tool_use` part's tool name.
    #[serde(default, borrow)]
    pub name: Option<std::borrow::Cow<'a, str>>,
    /// A `tool_use` part's input (counted as its JSON text).
    #[serde(default)]
    pub input: Option<serde_json::Value>,
    /// A `tool_result` part's content: text or parts.
    #[serde(default, borrow)]
    pub content: Option<Box<Content<'a>>>,
    /// An `image_url` part's image (its `detail` decides its cost).
    #[serde(default, borrow)]
    pub image_url: Option<ImageUrl<'a>>,
    /// An Anthropic `image` part's source (its size, when it carries the
    /// image itself, decides its cost).
    #[serde(default, borrow)]
    pub source: Option<ImageSource<'a>>,
    /// An `input_audio` part's audio (its length decides its cost).
    #[serde(default, borrow)]
    pub input_audio: Option<InputAudio<'a>>,
}

/// An `input_audio` part's audio, as far as counting needs it.
#[derive(Debug, Deserialize)]
pub struct InputAudio<'a> {
    /// The base64 audio.
    #[serde(default, borrow)]
    pub data: Option<std::borrow::Cow<'a, str>>,
    /// `wav` or `mp3`.
    #[serde(default, borrow)]
    pub format: Option<std::borrow::Cow<'a, str>>,
}

/// An Anthropic `image` part's source, as far as counting needs it.
#[derive(Debug, Deserialize)]
pub struct ImageSource<'a> {
    /// `base64` (the image itself), `url` or `file`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<std::borrow::Cow<'a, str>>,
    /// The base64 image of a `base64` source.
    #[serde(default, borrow)]
    pub data: Option<std::borrow::Cow<'a, str>>,
}

/// An Anthropic image's tokens: by its size when the request carries it
/// (`base64`), else the most one costs.
pub fn anthropic_image_tokens(source: Option<&ImageSource<'_>>) -> u64 {
    (source.filter(|s| s.kind.as_deref() == Some("base64")))
        .and_then(|s| image::base64_size(s.data.as_deref()?))
        .map_or(ANTHROPIC_IMAGE_MOST_TOKENS, |(w, h)| {
            image::anthropic_tokens(w, h)
        })
}

/// An `image_url` part's image, as far as counting needs it.
#[derive(Debug, Deserialize)]
pub struct ImageUrl<'a> {
    /// Its address, or the image itself as a `data:` URL.
    #[serde(default, borrow)]
    pub url: Option<std::borrow::Cow<'a, str>>,
    /// `low`, `high` or `auto` (absent: `auto`).
    #[serde(default, borrow)]
    pub detail: Option<std::borrow::Cow<'a, str>>,
}

impl Content<'_> {
    /// Tokens of this content.
    pub fn count<'c>(&self, counter: impl Into<TokenCounter<'c>>) -> u64 {
        let counter = counter.into();
        match self {
            Content::Text(text) => counter.count_text(text),
            Content::Parts(parts) => parts
                .iter()
                .map(|part| match (&*part.kind, &part.text) {
                    ("text", Some(text)) => counter.count_text(text),
                    ("tool_use", _) => {
                        let name = part.name.as_deref().map_or(0, |n| counter.count_text(n));
                        let input = part.input.as_ref().map_or(0, |i| count_json(counter, i));
                        TOKENS_PER_MESSAGE + name + input
                    }
                    ("tool_result", _) => {
                        let content = part.content.as_ref().map_or(0, |c| c.count(counter));
                        TOKENS_PER_MESSAGE + content
                    }
                    ("image_url", _) => {
                        let image = part.image_url.as_ref();
                        let detail = image.and_then(|i| i.detail.as_deref());
                        counter.image_tokens(detail, image.and_then(|i| i.url.as_deref()))
                    }
                    ("image", _) => anthropic_image_tokens(part.source.as_ref()),
                    ("input_audio", _) => (part.input_audio.as_ref()).map_or(0, |audio| {
                        let data = audio.data.as_deref().unwrap_or_default();
                        audio::input_audio_tokens(data, audio.format.as_deref())
                    }),
                    _ => NON_TEXT_PART_TOKENS,
                })
                .sum(),
        }
    }
}

/// Prompt tokens of a chat request, counted as OpenAI counts them.
pub fn count_chat_prompt<'c>(
    counter: impl Into<TokenCounter<'c>>,
    messages: &[ChatMessage<'_>],
) -> u64 {
    let counter = counter.into();
    let per_message: u64 = messages
        .iter()
        .map(|m| {
            let calls: u64 = (m.tool_calls.iter().flatten())
                .filter_map(|call| call.function.as_ref())
                .chain(&m.function_call)
                .map(|call| call.count(counter))
                .sum();
            TOKENS_PER_MESSAGE
                + counter.count_role(&m.role)
                + m.content.as_ref().map_or(0, |c| c.count(counter))
                + m.name
                    .as_ref()
                    .map_or(0, |n| TOKENS_PER_NAME + counter.count_text(n))
                + calls
        })
        .sum();
    per_message + REPLY_PRIMING_TOKENS
}

/// The tokens of `value`'s JSON text: what a definition (tools, a response
/// schema) or a tool's input costs at most. Providers render them in formats
/// of their own, terser than JSON (no quotes around keys, no braces per
/// level), so this counts more than they do, never less for text they bill.
pub fn count_json<'c>(counter: impl Into<TokenCounter<'c>>, value: &serde_json::Value) -> u64 {
    match value {
        serde_json::Value::Null => 0,
        other => counter.into().count_text(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_its_budget_a_text_is_costed_by_its_length_without_tokenising() {
        let encoding = Encoding::Cl100kBase;
        let words = "the quick brown fox jumps over the lazy dog ".repeat(20_000);
        let exact = encoding.count_text(&words);
        // Within the budget: counted exactly, and spent.
        let roomy = CountBudget::new(exact + 10);
        let counter = TokenCounter::from(encoding).with_budget(&roomy);
        assert_eq!(counter.count_text(&words), exact);
        assert_eq!(counter.count_text("hi"), encoding.count_text("hi"));
        // A budget the text exceeds: its length, above its tokens, at once.
        let tight = CountBudget::new(1_000);
        let counter = TokenCounter::from(encoding).with_budget(&tight);
        assert_eq!(counter.count_text("hello there"), 2);
        let costed = counter.count_text(&words);
        assert_eq!(costed, words.len() as u64);
        assert!(costed > exact);
        // Spent: every later text by its length too.
        assert_eq!(counter.count_text("hi"), 2);
        // The longest token bounds a text's tokens from below.
        let longest = encoding.longest_token_bytes();
        assert!((16..=256).contains(&longest), "{longest}");
        assert!(exact >= (words.len() as u64).div_ceil(longest));
    }

    #[test]
    fn cookbook_example_counts_match_openai() {
        // (3 framing + "system" 1 + "You are a helpful assistant." 6)
        // + (3 + "user" 1 + "Hello!" 2) + 3 priming = 19, as the API reports for gpt-4.
        let body = r#"[{"role":"system","content":"You are a helpful assistant."},
                       {"role":"user","content":"Hello!"}]"#;
        let messages: Vec<ChatMessage> = serde_json::from_str(body).unwrap();
        assert_eq!(count_chat_prompt(Encoding::Cl100kBase, &messages), 19);
    }

    #[test]
    fn names_and_parts_are_counted() {
        let body = r#"[{"role":"user","name":"bob","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]"#;
        let messages: Vec<ChatMessage> = serde_json::from_str(body).unwrap();
        let enc = Encoding::Cl100kBase;
        let expected = TOKENS_PER_MESSAGE
            + enc.count_text("user")
            + TOKENS_PER_NAME
            + enc.count_text("bob")
            + enc.count_text("hi")
            + IMAGE_HIGH_DETAIL_MOST_TOKENS
            + REPLY_PRIMING_TOKENS;
        assert_eq!(count_chat_prompt(enc, &messages), expected);
    }

    #[test]
    fn an_image_costs_by_its_detail_and_an_unknown_part_the_flat_cost() {
        let parts: Content = serde_json::from_str(
            r#"[{"type":"image_url","image_url":{"url":"x","detail":"low"}},
                {"type":"image_url","image_url":{"url":"x","detail":"high"}},
                {"type":"image","source":{"type":"base64","media_type":"image/png","data":"..."}},
                {"type":"file","file":{"file_id":"file-1"}}]"#,
        )
        .unwrap();
        assert_eq!(
            parts.count(Encoding::Cl100kBase),
            IMAGE_LOW_DETAIL_TOKENS
                + IMAGE_HIGH_DETAIL_MOST_TOKENS
                + ANTHROPIC_IMAGE_MOST_TOKENS
                + NON_TEXT_PART_TOKENS
        );
    }

    #[test]
    fn a_role_counts_as_its_text_does_common_or_not() {
        for enc in [
            Encoding::Cl100kBase,
            Encoding::O200kBase,
            Encoding::CharsPerToken(2.0),
        ] {
            for role in COMMON_ROLES
                .into_iter()
                .chain(["critic", "User", "", "assistant "])
            {
                assert_eq!(
                    enc.count_role(role),
                    enc.count_text(role),
                    "{enc:?} {role:?}"
                );
            }
        }
    }

    #[test]
    fn ratio_encoding_rounds_up_and_parse_rejects_nonsense() {
        let enc = Encoding::parse("chars-per-token:4").unwrap();
        assert_eq!(enc.count_text("abcde"), 2);
        assert_eq!(enc.count_text(""), 0);
        assert!(Encoding::parse("chars-per-token:0").is_err());
        assert!(Encoding::parse("p51k").is_err());
        assert_eq!(
            Encoding::for_openai_model("gpt-4o-mini"),
            Some(Encoding::O200kBase)
        );
        assert_eq!(
            Encoding::for_openai_model("gpt-4"),
            Some(Encoding::Cl100kBase)
        );
        assert_eq!(Encoding::for_openai_model("claude-3-5-sonnet"), None);
    }
}

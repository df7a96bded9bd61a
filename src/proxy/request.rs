//! Parsing only what the limiter needs from a request body (model, prompt, max
//! tokens, n, stream), with every other field forwarded untouched: the original bytes
//! are sent on, except for streams, where `stream_options.include_usage` is switched
//! on so the upstream reports usage (and that chunk is stripped again if the client
//! did not ask for it).

use super::error::ApiError;
use crate::tokens::{
    ChatMessage, Content, TokenCounter, count_chat_prompt, count_json, count_responses_prompt,
};
use bytes::Bytes;
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::Arc;

use super::usage::UsageBound;
pub use crate::config::bounds::MAX_TOKENS_CAP;
/// Largest `n` (choices per request) accepted.
pub const MAX_CHOICES: i64 = 128;

pub use crate::api::Api;

/// What the limiter needs to know about one request.
#[derive(Debug)]
pub struct Parsed {
    /// Requested model (shared: the limiter's requests carry it on).
    pub model: Arc<str>,
    /// Prompt tokens, counted as the provider counts them.
    pub prompt_tokens: u64,
    /// Upper bound of completion tokens (max_tokens x n, or the default).
    pub max_completion_tokens: u64,
    /// SSE response expected.
    pub stream: bool,
    /// Bytes to send upstream.
    pub body: Bytes,
    /// The gateway asked for the usage chunk; remove it from the client's stream.
    pub strip_usage_chunk: bool,
    /// The most usage the provider may report for this request
    /// ([`UsageBound`]): more is clamped.
    pub usage_bound: UsageBound,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The tokens of what a request defines for the model beside its messages
/// (tools and their choice, the legacy functions, a response format's
/// schema): each counted as its JSON text (`tokens::count_json`).
fn count_definitions(counter: TokenCounter<'_>, definitions: &[&Option<serde_json::Value>]) -> u64 {
    (definitions.iter().copied().flatten())
        .map(|value| count_json(counter, value))
        .sum()
}

#[derive(Deserialize)]
struct ChatBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    functions: Option<serde_json::Value>,
    #[serde(default)]
    function_call: Option<serde_json::Value>,
    #[serde(default)]
    response_format: Option<serde_json::Value>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

/// A prompt or input: text, list of texts, or pre-tokenised ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum TextInput<'a> {
    #[serde(borrow)]
    One(Cow<'a, str>),
    #[serde(borrow)]
    Many(Vec<Cow<'a, str>>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl TextInput<'_> {
    /// How many prompts: each gets its own completion(s).
    fn prompts(&self) -> u64 {
        match self {
            TextInput::One(_) | TextInput::Tokens(_) => 1,
            TextInput::Many(texts) => texts.len().max(1) as u64,
            TextInput::TokenLists(lists) => lists.len().max(1) as u64,
        }
    }

    fn count(&self, counter: TokenCounter<'_>) -> u64 {
        match self {
            TextInput::One(text) => counter.count_text(text),
            TextInput::Many(texts) => texts.iter().map(|t| counter.count_text(t)).sum(),
            TextInput::Tokens(ids) => ids.len() as u64,
            TextInput::TokenLists(lists) => lists.iter().map(|l| l.len() as u64).sum(),
        }
    }
}

#[derive(Deserialize)]
struct CompletionsBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    prompt: TextInput<'a>,
    max_tokens: Option<i64>,
    n: Option<i64>,
    /// Completions generated per prompt (the best `n` returned), every one
    /// billed.
    best_of: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct EmbeddingsBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    input: TextInput<'a>,
}

#[derive(Deserialize)]
struct MessagesBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    #[serde(borrow)]
    messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    #[serde(default, borrow)]
    system: Option<Content<'a>>,
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct CountTokensBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ResponsesBody<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    /// A string or a list of items (absent when a stored prompt or an earlier
    /// response supplies it).
    #[serde(default)]
    input: Option<serde_json::Value>,
    #[serde(default, borrow)]
    instructions: Option<Cow<'a, str>>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    max_output_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
}

/// Settings the parser needs.
#[derive(Clone, Copy, Debug)]
pub struct ParseSettings {
    /// Completion bound when the request sets none.
    pub default_max_tokens: u64,
}

fn json_error(err: &serde_json::Error) -> ApiError {
    let text = err.to_string();
    // serde names a missing field as "missing field `model`"; point `param` at it.
    let param = text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
        .map(str::to_owned);
    let mut e = ApiError::bad_request(format!("Invalid request body: {text}"), None);
    e.param = param;
    e
}

fn check_max_tokens(value: Option<i64>, field: &str, default: u64) -> Result<u64, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if (1..=MAX_TOKENS_CAP).contains(&v) => Ok(v as u64),
        Some(v) => Err(ApiError::bad_request(
            format!("`{field}` must be between 1 and {MAX_TOKENS_CAP}, got {v}"),
            Some(field),
        )),
    }
}

/// The most output a request may produce: what it asked for (`max` per
/// choice), or, when it set no maximum, the most any request may ask.
fn output_bound(explicit: bool, max: u64, choices: u64) -> u64 {
    let per_choice = if explicit { max } else { MAX_TOKENS_CAP as u64 };
    per_choice.saturating_mul(choices)
}

fn check_n(n: Option<i64>) -> Result<u64, ApiError> {
    check_choices(n, "n")
}

/// Choices a request asks for in `field` (`n`, `best_of`): 1 when absent.
fn check_choices(n: Option<i64>, field: &'static str) -> Result<u64, ApiError> {
    match n {
        None => Ok(1),
        Some(v) if (1..=MAX_CHOICES).contains(&v) => Ok(v as u64),
        Some(v) => Err(ApiError::bad_request(
            format!("`{field}` must be between 1 and {MAX_CHOICES}, got {v}"),
            Some(field),
        )),
    }
}

/// Parses `body` for `api`. `counter_for(model)` picks how its texts are counted
/// (it knows the route's encoding, the node's memo and the tenant); it may refuse
/// an unknown model with the 404 the caller should see.
pub fn parse<'c>(
    api: Api,
    body: Bytes,
    settings: ParseSettings,
    counter_for: impl Fn(&str) -> Result<TokenCounter<'c>, ApiError>,
) -> Result<Parsed, ApiError> {
    let default = settings.default_max_tokens;
    let fields = match api {
        Api::Chat => chat_fields(&body, default, &counter_for)?,
        Api::Completions => completions_fields(&body, default, &counter_for)?,
        Api::Embeddings => {
            let b: EmbeddingsBody = serde_json::from_slice(&body).map_err(|e| json_error(&e))?;
            let counter = counter_for(&b.model)?;
            Fields {
                prompt_tokens: b.input.count(counter),
                model: Arc::from(b.model),
                max_completion: 0,
                output_bound: 0,
                stream: false,
                wants_usage: false,
            }
        }
        Api::Messages => messages_fields(&body, default, &counter_for)?,
        Api::Responses => responses_fields(&body, default, &counter_for)?,
        Api::CountTokens => {
            let b: CountTokensBody = serde_json::from_slice(&body).map_err(|e| json_error(&e))?;
            // The model must be routed; nothing is reserved: the provider
            // counts, and bills nothing.
            counter_for(&b.model)?;
            Fields {
                model: Arc::from(b.model),
                prompt_tokens: 0,
                max_completion: 0,
                output_bound: 0,
                stream: false,
                wants_usage: true,
            }
        }
    };
    let openai_stream = fields.stream && matches!(api, Api::Chat | Api::Completions);
    let strip_usage_chunk = openai_stream && !fields.wants_usage;
    let body = if strip_usage_chunk {
        with_usage_requested(&body)?
    } else {
        body
    };
    let usage_bound = UsageBound::of(fields.prompt_tokens, fields.output_bound, &body);
    Ok(Parsed {
        model: fields.model,
        prompt_tokens: fields.prompt_tokens,
        max_completion_tokens: fields.max_completion,
        stream: fields.stream,
        body,
        strip_usage_chunk,
        usage_bound,
    })
}

/// What a request's body says, whatever its API.
struct Fields {
    model: Arc<str>,
    prompt_tokens: u64,
    /// The completion bound, for every choice asked.
    max_completion: u64,
    /// The most output the request may produce: `max_completion` when the
    /// request set its maximum, else [`MAX_TOKENS_CAP`] per choice.
    output_bound: u64,
    stream: bool,
    /// The client asked for the stream's usage chunk itself (or the API always
    /// sends usage).
    wants_usage: bool,
}

fn chat_fields<'c>(
    body: &[u8],
    default: u64,
    counter_for: &impl Fn(&str) -> Result<TokenCounter<'c>, ApiError>,
) -> Result<Fields, ApiError> {
    let b: ChatBody = serde_json::from_slice(body).map_err(|e| json_error(&e))?;
    let counter = counter_for(&b.model)?;
    let max = match b.max_completion_tokens {
        Some(_) => check_max_tokens(b.max_completion_tokens, "max_completion_tokens", default)?,
        None => check_max_tokens(b.max_tokens, "max_tokens", default)?,
    };
    let choices = check_n(b.n)?;
    let explicit = b.max_completion_tokens.is_some() || b.max_tokens.is_some();
    Ok(Fields {
        wants_usage: b.stream_options.as_ref().is_some_and(|o| o.include_usage),
        prompt_tokens: count_chat_prompt(counter, &b.messages)
            + count_definitions(
                counter,
                &[
                    &b.tools,
                    &b.tool_choice,
                    &b.functions,
                    &b.function_call,
                    &b.response_format,
                ],
            ),
        max_completion: max * choices,
        output_bound: output_bound(explicit, max, choices),
        stream: b.stream.unwrap_or(false),
        model: Arc::from(b.model),
    })
}

fn completions_fields<'c>(
    body: &[u8],
    default: u64,
    counter_for: &impl Fn(&str) -> Result<TokenCounter<'c>, ApiError>,
) -> Result<Fields, ApiError> {
    let b: CompletionsBody = serde_json::from_slice(body).map_err(|e| json_error(&e))?;
    let counter = counter_for(&b.model)?;
    // Every prompt of a list gets its own `n` completions, `best_of` of them
    // generated (and billed) when it asks for more.
    let choices = check_n(b.n)?.max(check_choices(b.best_of, "best_of")?);
    let per_prompt = check_max_tokens(b.max_tokens, "max_tokens", default)? * choices;
    let max = per_prompt.saturating_mul(b.prompt.prompts());
    let bound = output_bound(b.max_tokens.is_some(), per_prompt / choices, choices)
        .saturating_mul(b.prompt.prompts());
    Ok(Fields {
        wants_usage: b.stream_options.as_ref().is_some_and(|o| o.include_usage),
        prompt_tokens: b.prompt.count(counter),
        max_completion: max,
        output_bound: bound,
        stream: b.stream.unwrap_or(false),
        model: Arc::from(b.model),
    })
}

fn messages_fields<'c>(
    body: &[u8],
    default: u64,
    counter_for: &impl Fn(&str) -> Result<TokenCounter<'c>, ApiError>,
) -> Result<Fields, ApiError> {
    let b: MessagesBody = serde_json::from_slice(body).map_err(|e| json_error(&e))?;
    let counter = counter_for(&b.model)?;
    if b.max_tokens.is_none() {
        return Err(ApiError::bad_request(
            "`max_tokens` is required",
            Some("max_tokens"),
        ));
    }
    let max = check_max_tokens(b.max_tokens, "max_tokens", default)?;
    let system = b.system.map(|content| ChatMessage {
        role: "system".into(),
        content: Some(content),
        name: None,
        tool_calls: None,
        function_call: None,
    });
    let messages: Vec<_> = system.into_iter().chain(b.messages).collect();
    Ok(Fields {
        prompt_tokens: count_chat_prompt(counter, &messages)
            + count_definitions(counter, &[&b.tools, &b.tool_choice])
            + anthropic_tool_prompt(&b.tools),
        max_completion: max,
        output_bound: max,
        stream: b.stream.unwrap_or(false),
        // Anthropic streams always carry usage.
        wants_usage: true,
        model: Arc::from(b.model),
    })
}

fn responses_fields<'c>(
    body: &[u8],
    default: u64,
    counter_for: &impl Fn(&str) -> Result<TokenCounter<'c>, ApiError>,
) -> Result<Fields, ApiError> {
    let b: ResponsesBody = serde_json::from_slice(body).map_err(|e| json_error(&e))?;
    let counter = counter_for(&b.model)?;
    let prompt_tokens = count_responses_prompt(
        counter,
        b.instructions.as_deref(),
        b.input.as_ref(),
        b.tools.as_ref(),
    );
    let max = check_max_tokens(b.max_output_tokens, "max_output_tokens", default)?;
    Ok(Fields {
        prompt_tokens,
        max_completion: max,
        output_bound: output_bound(b.max_output_tokens.is_some(), max, 1),
        stream: b.stream.unwrap_or(false),
        // The stream's `response.completed` event always carries the usage.
        wants_usage: true,
        model: Arc::from(b.model),
    })
}

/// Anthropic's tool-use system prompt, once a request defines tools.
fn anthropic_tool_prompt(tools: &Option<serde_json::Value>) -> u64 {
    let defined = tools
        .as_ref()
        .and_then(serde_json::Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if defined {
        crate::tokens::ANTHROPIC_TOOL_PROMPT_TOKENS
    } else {
        0
    }
}

/// Rewrites a streaming body to ask for the final usage chunk, keeping every other
/// field as it was.
fn with_usage_requested(body: &Bytes) -> Result<Bytes, ApiError> {
    let mut value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| json_error(&e))?;
    let options = value
        .entry("stream_options")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    // `null` is what clients that serialise unset fields send: the same as absent.
    if options.is_null() {
        *options = serde_json::Value::Object(Default::default());
    }
    match options {
        serde_json::Value::Object(map) => {
            map.insert("include_usage".into(), serde_json::Value::Bool(true));
        }
        _ => {
            return Err(ApiError::bad_request(
                "`stream_options` must be an object",
                Some("stream_options"),
            ));
        }
    }
    serde_json::to_vec(&value)
        .map(Bytes::from)
        .map_err(|e| json_error(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Encoding;

    const SETTINGS: ParseSettings = ParseSettings {
        default_max_tokens: 4096,
    };

    fn chat(body: &str) -> Result<Parsed, ApiError> {
        parse(Api::Chat, Bytes::from(body.to_owned()), SETTINGS, |_| {
            Ok(Encoding::Cl100kBase.into())
        })
    }

    #[test]
    fn chat_counts_prompt_and_multiplies_max_tokens_by_n() {
        let p = chat(r#"{"model":"gpt-4","messages":[{"role":"user","content":"Hello!"}],"max_tokens":10,"n":3,"x_unknown":{"a":1}}"#).unwrap();
        assert_eq!(p.prompt_tokens, 3 + 1 + 2 + 3);
        assert_eq!(p.max_completion_tokens, 30);
        assert!(!p.stream && !p.strip_usage_chunk);
        assert!(
            std::str::from_utf8(&p.body).unwrap().contains("x_unknown"),
            "original bytes forwarded"
        );
    }

    #[test]
    fn stream_without_include_usage_is_rewritten_and_keeps_unknown_fields() {
        let p = chat(r#"{"model":"m","messages":[],"stream":true,"zz":[1,2]}"#).unwrap();
        assert!(p.stream && p.strip_usage_chunk);
        let v: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["zz"], serde_json::json!([1, 2]));
        let q = chat(
            r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert!(!q.strip_usage_chunk);
        // `null` (clients that serialise unset fields) is the same as absent.
        let n = chat(r#"{"model":"m","messages":[],"stream":true,"stream_options":null}"#).unwrap();
        assert!(n.strip_usage_chunk);
        let v: serde_json::Value = serde_json::from_slice(&n.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn bad_inputs_are_400_with_param() {
        let e = chat(r#"{"messages":[]}"#).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("model"))
        );
        let e = chat(r#"{"model":"m","messages":[],"max_tokens":-5}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = chat(r#"{"model":"m","messages":[],"max_tokens":99999999999}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(
            chat(r#"{"model":"m","messages":"hi"}"#).unwrap_err().status,
            400
        );
        assert_eq!(chat("{not json").unwrap_err().status, 400);
        let invalid_utf8 = Bytes::from_static(b"{\"model\":\"\xff\xfe\",\"messages\":[]}");
        let e = parse(Api::Chat, invalid_utf8, SETTINGS, |_| {
            Ok(Encoding::Cl100kBase.into())
        })
        .unwrap_err();
        assert_eq!(e.status, 400);
    }

    #[test]
    fn messages_require_max_tokens_and_count_system() {
        let body = |s: &str| Bytes::from(s.to_owned());
        let e = parse(
            Api::Messages,
            body(r#"{"model":"c","messages":[]}"#),
            SETTINGS,
            |_| Ok(Encoding::Cl100kBase.into()),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let p = parse(
            Api::Messages,
            body(r#"{"model":"c","system":"Be brief.","messages":[{"role":"user","content":"Hi"}],"max_tokens":7}"#),
            SETTINGS,
            |_| Ok(Encoding::Cl100kBase.into()),
        )
        .unwrap();
        assert_eq!(p.max_completion_tokens, 7);
        assert!(p.prompt_tokens > 3 + 3 + 3);
    }

    #[test]
    fn tools_tool_calls_and_tool_results_are_counted() {
        let enc = Encoding::Cl100kBase;
        let plain = chat(r#"{"model":"m","messages":[{"role":"user","content":"Weather?"}]}"#)
            .unwrap()
            .prompt_tokens;
        let tools = r#"[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]"#;
        let with_tools = chat(&format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"Weather?"}}],"tools":{tools},"tool_choice":"auto"}}"#
        ))
        .unwrap()
        .prompt_tokens;
        let tools_json: serde_json::Value = serde_json::from_str(tools).unwrap();
        assert_eq!(
            with_tools - plain,
            enc.count_text(&tools_json.to_string()) + enc.count_text("\"auto\""),
            "each definition by its JSON text"
        );
        // An assistant's call and the tool's result: the call's name and
        // arguments, the result as the tool message's content.
        let turn = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"Weather?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"sunny"}]}"#,
        )
        .unwrap()
        .prompt_tokens;
        let call = 3 + enc.count_text("get_weather") + enc.count_text(r#"{"city":"Paris"}"#);
        let result = 3 + enc.count_text("tool") + enc.count_text("sunny");
        assert_eq!(
            turn - plain,
            (3 + enc.count_text("assistant") + call) + result
        );
        // Anthropic: tools, a tool_use and its tool_result.
        let messages = |extra: &str| {
            parse(
                Api::Messages,
                Bytes::from(format!(
                    r#"{{"model":"c","max_tokens":5,"messages":[{{"role":"user","content":"Weather?"}}{extra}]}}"#
                )),
                SETTINGS,
                |_| Ok(Encoding::Cl100kBase.into()),
            )
            .unwrap()
            .prompt_tokens
        };
        let base = messages("");
        let used = messages(
            r#",{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}"#,
        );
        let tool_use = 3 + enc.count_text("get_weather") + enc.count_text(r#"{"city":"Paris"}"#);
        let tool_result = 3 + enc.count_text("sunny");
        let framing = 2 * 3 + enc.count_text("assistant") + enc.count_text("user");
        assert_eq!(used - base, framing + tool_use + tool_result);
    }

    #[test]
    fn a_list_of_prompts_reserves_every_prompts_completions() {
        let completions = |body: &'static str| {
            parse(
                Api::Completions,
                Bytes::from_static(body.as_bytes()),
                SETTINGS,
                |_| Ok(Encoding::Cl100kBase.into()),
            )
            .unwrap()
        };
        let one = completions(r#"{"model":"m","prompt":"a b","max_tokens":10,"n":2}"#);
        assert_eq!(one.max_completion_tokens, 20);
        let three = completions(r#"{"model":"m","prompt":["a","b","c"],"max_tokens":10,"n":2}"#);
        assert_eq!(
            three.max_completion_tokens, 60,
            "10 x 2 choices x 3 prompts"
        );
        let best = completions(r#"{"model":"m","prompt":["a","b"],"max_tokens":10,"best_of":3}"#);
        assert_eq!(best.max_completion_tokens, 60, "10 x best_of 3 x 2 prompts");
        let lists = completions(r#"{"model":"m","prompt":[[1,2],[3]],"max_tokens":10}"#);
        assert_eq!((lists.prompt_tokens, lists.max_completion_tokens), (3, 20));
    }

    #[test]
    fn a_responses_request_counts_its_input_and_caps_by_max_output_tokens() {
        let p = parse(
            Api::Responses,
            Bytes::from_static(
                br#"{"model":"m","instructions":"Be brief.","input":"Hello!","max_output_tokens":12,"stream":true}"#,
            ),
            SETTINGS,
            |_| Ok(Encoding::Cl100kBase.into()),
        )
        .unwrap();
        assert_eq!(p.max_completion_tokens, 12);
        assert!(
            p.stream && !p.strip_usage_chunk,
            "usage comes with response.completed"
        );
        assert!(p.prompt_tokens > 3 + 3 + 3);
        let e = parse(
            Api::Responses,
            Bytes::from_static(br#"{"model":"m","input":"x","max_output_tokens":0}"#),
            SETTINGS,
            |_| Ok(Encoding::Cl100kBase.into()),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
    }

    #[test]
    fn embeddings_count_every_input_and_reserve_no_completion() {
        let p = parse(
            Api::Embeddings,
            Bytes::from_static(br#"{"model":"text-embedding-3-small","input":["a b","c"]}"#),
            SETTINGS,
            |_| Ok(Encoding::Cl100kBase.into()),
        )
        .unwrap();
        assert_eq!((p.prompt_tokens, p.max_completion_tokens), (3, 0));
    }
}

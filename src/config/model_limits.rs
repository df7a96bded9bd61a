//! `[[tenants.model_limits]]` and `[[upstreams.model_limits]]`: limits on the
//! requests for some models, beside the scope's own. A provider limits each
//! model (or family) of one account apart (OpenAI's per-model limits); a
//! tenant may have a quota for one model within its whole.

use super::Quota;
use serde::{Deserialize, Serialize};

/// Most model groups one tenant or upstream may have (each is an actor and a
/// key per limit).
pub const MAX_MODEL_GROUPS: usize = 64;

/// The longest ending a scope's limit key takes, its dimension's name
/// (`<scope>:requests_per_day`): what a group's name must leave room for.
pub const LONGEST_KEY_ENDING: &str = ":requests_per_day";

/// One model group's limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimitConfig {
    /// Models it covers: exact names, `prefix*`, or `*`. A request counts in the
    /// first group of its scope that matches its model, and in none when none
    /// does.
    pub models: Vec<String>,
    /// The group's name in keys and metrics (`upstream-model:<id>@<name>`);
    /// default: its first pattern.
    #[serde(default)]
    pub name: Option<String>,
    /// Its limits (`rpm`, `tpm`, `itpm`, `otpm`, `concurrency`, ...).
    #[serde(flatten)]
    pub quota: Quota,
}

impl ModelLimitConfig {
    /// The group's name: `name`, or its first pattern.
    pub fn group_name(&self) -> &str {
        (self.name.as_deref())
            .or(self.models.first().map(String::as_str))
            .unwrap_or_default()
    }
}

/// Whether `model` matches `pattern`: equal, or `prefix*` and it starts with
/// the prefix (`*` alone matches every model). The rule routes use too.
pub fn model_matches(pattern: &str, model: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => model.starts_with(prefix),
        None => pattern == model,
    }
}

/// Why a scope's model groups are refused: the field (below `path`) and the
/// reason.
pub(super) fn check(path: &str, groups: &[ModelLimitConfig]) -> Result<(), (String, String)> {
    if groups.len() > MAX_MODEL_GROUPS {
        let why = format!("at most {MAX_MODEL_GROUPS} groups");
        return Err((format!("{path}.model_limits"), why));
    }
    let mut names = std::collections::HashSet::new();
    for (i, group) in groups.iter().enumerate() {
        let at = format!("{path}.model_limits[{i}]");
        let bad_pattern = |m: &String| m.is_empty() || m.trim_end_matches('*').contains('*');
        if group.models.is_empty() || group.models.iter().any(bad_pattern) {
            let why = "needs at least one model name or `prefix*` pattern (`*` only at the end)";
            return Err((format!("{at}.models"), why.to_owned()));
        }
        let name = group.group_name();
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-_.*".contains(&b);
        if name.is_empty() || name.len() > 64 || !name.bytes().all(allowed) {
            let field = if group.name.is_some() {
                "name"
            } else {
                "models[0]"
            };
            let why = "a group's name (its `name`, else its first pattern) must be 1-64 characters of [A-Za-z0-9-_.*]";
            return Err((format!("{at}.{field}"), why.to_owned()));
        }
        if !names.insert(name) {
            let why = format!("two groups are named {name:?} (set `name` on one)");
            return Err((format!("{at}.name"), why));
        }
    }
    Ok(())
}

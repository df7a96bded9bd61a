//! # Configuration
//!
//! TOML, strict: unknown fields are refused, durations carry units, secrets come from
//! env vars (`${OPENAI_API_KEY}`), API keys are stored as SHA-256 hashes. Loading is
//! parse ([`model`]) then expand secrets then cross-field rules ([`validate`]); every
//! error names the file, the field and the reason. Reference: `docs/config.md`.

pub mod bounds;
pub mod duration;
pub mod model;
pub mod model_limits;
pub mod passthrough;
pub mod validate;

pub use bounds::Algorithm;
pub use model::*;
pub use model_limits::{ModelLimitConfig, model_matches};
pub use passthrough::Passthrough;

use sha2::{Digest, Sha256};
use std::path::Path;

/// The embedded demo configuration `tollgate` runs with no arguments.
pub const DEMO_TOML: &str = include_str!("../../config/demo.toml");

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The IO error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown field, or a wrong type (toml's message names the
    /// field and the line).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// toml's explanation.
        message: String,
    },
    /// A value or a combination of values that cannot work.
    #[error("{file}: {field}: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// Dotted path of the offending field, e.g. `tenants[0].tpm`.
        field: String,
        /// What is wrong and what would be right.
        reason: String,
    },
}

impl Config {
    /// Reads, parses, expands and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::from_toml(&text, &file)
    }

    /// The embedded demo configuration.
    pub fn demo() -> Result<Config, ConfigError> {
        Config::from_toml(DEMO_TOML, "<embedded demo config>")
    }

    /// Parses, expands (from the process environment) and validates TOML text;
    /// `file` names it in errors.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(text, file, &|name| std::env::var(name).ok())
    }

    /// As [`Config::from_toml`], with `${NAME}` looked up through `env`.
    pub fn from_toml_with_env(
        text: &str,
        file: &str,
        env: EnvLookup<'_>,
    ) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.expand_secrets(file, env)?;
        validate::validate(&config).map_err(|v| ConfigError::Invalid {
            file: file.to_owned(),
            field: v.field,
            reason: v.reason,
        })?;
        Ok(config)
    }

    fn expand_secrets(&mut self, file: &str, env: EnvLookup<'_>) -> Result<(), ConfigError> {
        let invalid = |field: String, reason: String| ConfigError::Invalid {
            file: file.to_owned(),
            field,
            reason,
        };
        if let Some(token) = &self.server.admin_token {
            self.server.admin_token =
                Some(expand_env(token, env).map_err(|r| invalid("server.admin_token".into(), r))?);
        }
        if let Some(cluster) = &mut self.cluster
            && let Some(secret) = &cluster.secret
        {
            cluster.secret =
                Some(expand_env(secret, env).map_err(|r| invalid("cluster.secret".into(), r))?);
        }
        if let Some(cluster) = &mut self.cluster {
            for secret in &mut cluster.accept_secrets {
                *secret = expand_env(secret, env)
                    .map_err(|r| invalid("cluster.accept_secrets".into(), r))?;
            }
            let address = |field: &str, text: &Option<String>| -> Result<_, ConfigError> {
                let Some(text) = text else { return Ok(None) };
                let expanded = expand_env(text, env).map_err(|r| invalid(field.into(), r))?;
                let addr = expanded.parse::<std::net::SocketAddr>().map_err(|_| {
                    invalid(
                        field.into(),
                        format!(
                            "{expanded:?} is not an IP address and port (e.g. \"10.0.0.5:7946\")"
                        ),
                    )
                })?;
                Ok(Some(addr))
            };
            cluster.gossip_advertise =
                address("cluster.gossip_advertise", &cluster.gossip_advertise_text)?;
            cluster.rpc_advertise = address("cluster.rpc_advertise", &cluster.rpc_advertise_text)?;
        }
        if let Some(redis) = &mut self.redis
            && let Some(url) = &redis.url
        {
            redis.url = Some(expand_env(url, env).map_err(|r| invalid("redis.url".into(), r))?);
        }
        for (i, upstream) in self.upstreams.iter_mut().enumerate() {
            if let Some(key) = &upstream.api_key {
                upstream.api_key = Some(
                    expand_env(key, env)
                        .map_err(|r| invalid(format!("upstreams[{i}].api_key"), r))?,
                );
            }
        }
        Ok(())
    }
}

/// Replaces every `${NAME}` in `value` with the env var's value.
fn expand_env(value: &str, env: EnvLookup<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed \"${{\" in {value:?}"))?;
        let name = &after[..end];
        let var = env(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&var);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Looks up an environment variable by name (injected so tests need no global env).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// SHA-256 of an API key as lowercase hex: the form tenants' keys are stored in.
pub fn hash_api_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A stored key hash without its optional `sha256:` prefix, lowercased.
pub fn normalize_key_hash(stored: &str) -> String {
    stored
        .strip_prefix("sha256:")
        .unwrap_or(stored)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests;

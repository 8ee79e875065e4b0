//! The user's own configuration, `$XDG_CONFIG_HOME/sandmux/config.toml`
//! (or `~/.config/...`): settings that belong to the person running sandmux,
//! not to a profile an agent's workspace may name:
//!
//! ```toml
//! [audit]
//! keep_days = 30   # finished instances' logs older than this are removed; 0 keeps them
//!
//! [workspace]
//! keep_days = 14         # kept copy-on-write layers older than this are removed; 0 keeps them
//! kept_bytes = "20GiB"   # all kept layers together; past it, no instance starts
//! ```

use serde::Deserialize;
use std::path::PathBuf;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserConfig {
    /// `[audit]`.
    #[serde(default)]
    pub audit: AuditRetention,
    /// `[workspace]`.
    #[serde(default)]
    pub workspace: KeptLayers,
}

/// `[workspace]`: the copy-on-write layers instances leave for the human
/// (a missing key takes [`Default`]'s value).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KeptLayers {
    /// Days since a layer was made after which, its instance ended, it is
    /// removed when an instance starts; 0 keeps every layer.
    pub keep_days: u32,
    /// All kept layers together: past this, an instance refuses to start
    /// (the human reviews, applies or discards first).
    pub kept_bytes: super::schema::Size,
}

impl Default for KeptLayers {
    fn default() -> Self {
        KeptLayers {
            keep_days: 14,
            kept_bytes: super::schema::Size(20 << 30),
        }
    }
}

/// `[audit]`: how long finished instances' logs stay in the default audit
/// directory.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct AuditRetention {
    /// Days since a finished log's last record; 0 keeps every log.
    pub keep_days: u32,
}

impl Default for AuditRetention {
    fn default() -> Self {
        AuditRetention { keep_days: 30 }
    }
}

/// Where the file is.
pub(crate) fn path() -> PathBuf {
    super::config_dir()
        .parent()
        .map(|p| p.join("config.toml"))
        .unwrap_or_else(|| PathBuf::from("/nonexistent/config.toml"))
}

/// Why the user's file cannot be used (sandmux does not start: P5).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UserConfigError {
    /// TOML syntax, an unknown key, a wrong type: the parser's words with
    /// line and key.
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A `keep_days` past 100 years.
    #[error("{}: {key}.keep_days: {days} is more than 36500 (use 0 to keep every {what})", path.display())]
    KeepDays {
        path: PathBuf,
        key: &'static str,
        days: u32,
        what: &'static str,
    },
}

/// Reads the file; none, or one that cannot be read (a `HOME` that is not
/// this user's), means every default (the latter said once, with the fix).
/// An error names the file, the line and key, and what is wrong.
pub(crate) fn load() -> Result<UserConfig, UserConfigError> {
    let p = path();
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(UserConfig::default()),
        Err(e) => {
            // Optional, so never a reason to stop: said once, with the fix.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "{}: {e}: not read, every setting of it at its default (make it readable, or set XDG_CONFIG_HOME to a directory of yours)",
                    p.display()
                )
            });
            return Ok(UserConfig::default());
        }
    };
    let c: UserConfig = toml::from_str(&text).map_err(|e| UserConfigError::Parse {
        message: super::describe_toml_error(&text, &e),
        path: p.clone(),
    })?;
    let days = [
        ("workspace", c.workspace.keep_days, "layer"),
        ("audit", c.audit.keep_days, "log"),
    ];
    if let Some(&(key, days, what)) = days.iter().find(|(_, d, _)| *d > 36_500) {
        return Err(UserConfigError::KeepDays {
            path: p,
            key,
            days,
            what,
        });
    }
    Ok(c)
}

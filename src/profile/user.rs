//! The user's own configuration, `$XDG_CONFIG_HOME/sandmux/config.toml`
//! (or `~/.config/...`): settings that belong to the person running sandmux,
//! not to a profile an agent's workspace may name. Today one section:
//!
//! ```toml
//! [audit]
//! keep_days = 30   # finished instances' logs older than this are removed; 0 keeps them
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
}

/// `[audit]`: how long finished instances' logs stay in the default audit
/// directory.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditRetention {
    /// Days since a finished log's last record; 0 keeps every log.
    #[serde(default = "d_keep_days")]
    pub keep_days: u32,
}

impl Default for AuditRetention {
    fn default() -> Self {
        AuditRetention {
            keep_days: d_keep_days(),
        }
    }
}

fn d_keep_days() -> u32 {
    30
}

/// Where the file is.
pub(crate) fn path() -> PathBuf {
    super::config_dir()
        .parent()
        .map(|p| p.join("config.toml"))
        .unwrap_or_else(|| PathBuf::from("/nonexistent/config.toml"))
}

/// Reads the file; none means every default. An error names the file, the
/// line and key, and what is wrong.
pub(crate) fn load() -> Result<UserConfig, String> {
    let p = path();
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(UserConfig::default()),
        Err(e) => return Err(format!("{}: {e}", p.display())),
    };
    let c: UserConfig = toml::from_str(&text)
        .map_err(|e| format!("{}: {}", p.display(), super::describe_toml_error(&text, &e)))?;
    if c.audit.keep_days > 36_500 {
        return Err(format!(
            "{}: audit.keep_days: {} is more than 36500 (use 0 to keep every log)",
            p.display(),
            c.audit.keep_days
        ));
    }
    Ok(c)
}

//! Options, hooks and environments: shown freely; set only from sandmux's
//! list of harmless options and outside the names tmux, sandmux and the
//! loader use.

use super::Done;
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, SessionSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Option scope.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Scope {
    /// Server options.
    Server,
    /// Session options.
    Session,
    /// Window options.
    Window,
    /// Pane options.
    Pane,
}

/// `show_option`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShowOption {
    /// Option name, e.g. "history-limit".
    pub option: String,
    /// The tmux scope.
    pub scope: Option<Scope>,
    /// A session, window or pane id for the scope.
    pub target: Option<String>,
    /// The global value.
    #[serde(default)]
    pub global_: bool,
}

/// An option's value.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct OptionValue {
    /// Option name.
    pub option: String,
    /// Value (null when unset).
    pub value: Option<String>,
}

/// Checks an option name.
pub(crate) fn option_name(o: &str) -> Result<(), ToolError> {
    let ok = !o.is_empty()
        && o.len() <= 64
        && o.chars().all(|c| {
            c.is_ascii_alphanumeric() || c == '-' || c == '@' || c == '_' || c == '[' || c == ']'
        });
    if ok {
        Ok(())
    } else {
        Err(ToolError::invalid(
            "option",
            &format!("{o:?} is not an option name"),
            "e.g. history-limit",
        ))
    }
}

/// Builds the scope flags for show/set-option.
pub(crate) fn scope_cmd(
    mut cmd: Cmd,
    scope: Option<Scope>,
    target: &Option<String>,
    global: bool,
) -> Result<Cmd, ToolError> {
    if target.is_some() && scope.is_none() {
        return Err(ToolError::invalid(
            "scope",
            "is required with target",
            "give scope: session, window or pane",
        ));
    }
    cmd = match scope {
        Some(Scope::Server) => cmd.flag("-s"),
        Some(Scope::Window) => cmd.flag("-w"),
        Some(Scope::Pane) => cmd.flag("-p"),
        _ => cmd,
    };
    if global {
        cmd = cmd.flag("-g");
    }
    if let Some(t) = target {
        if !targets::is_id(t, &['$', '@', '%']) {
            return Err(ToolError::invalid(
                "target",
                &format!("{t:?} is not a session, window or pane id"),
                "use ids like $1, @2, %3",
            ));
        }
        cmd = cmd.opt("-t", t);
    }
    Ok(cmd)
}

/// Shows an option.
pub(crate) async fn show_option(c: &Call<'_>, a: ShowOption) -> Result<OptionValue, ToolError> {
    option_name(&a.option)?;
    let cmd = scope_cmd(
        Cmd::new("show-options").flag("-v").flag("-q"),
        a.scope,
        &a.target,
        a.global_,
    )?
    .arg(&a.option);
    let r = c.s.hub().run(&cmd).await?;
    let v = r
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(OptionValue {
        option: a.option,
        value: if r.is_empty() { None } else { Some(v) },
    })
}

/// Options `set_option` may set, with their allowed values.
const OPTIONS: &[(&str, &str)] = &[
    ("history-limit", "int:0:100000"),
    ("remain-on-exit", "on|off|failed"),
    ("mode-keys", "vi|emacs"),
    ("status-keys", "vi|emacs"),
    ("mouse", "on|off"),
    ("synchronize-panes", "on|off"),
    ("automatic-rename", "on|off"),
    ("allow-rename", "on|off"),
    ("aggressive-resize", "on|off"),
    ("main-pane-width", "int:1:1000"),
    ("main-pane-height", "int:1:1000"),
    ("base-index", "int:0:1000"),
    ("pane-base-index", "int:0:1000"),
    ("renumber-windows", "on|off"),
    ("monitor-silence", "int:0:86400"),
    ("wrap-search", "on|off"),
    ("display-time", "int:0:60000"),
    ("repeat-time", "int:0:60000"),
];

/// `set_option`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SetOption {
    /// One of the allowed option names.
    pub option: String,
    /// Its new value.
    pub value: String,
    /// The tmux scope.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// Set the global value.
    #[serde(default)]
    pub global_: bool,
}

/// Sets an allowlisted option.
pub(crate) async fn set_option(c: &Call<'_>, a: SetOption) -> Result<Done, ToolError> {
    let Some((_, rule)) = OPTIONS.iter().find(|(n, _)| *n == a.option) else {
        return Err(ToolError::refused(format!(
            "option {:?} is not on sandmux's list of harmless options ({}); shells, commands, formats, hooks, passthrough and clipboard options are never settable",
            a.option,
            OPTIONS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )));
    };
    let ok = if let Some(r) = rule.strip_prefix("int:") {
        let mut it = r.split(':').map(|x| x.parse::<i64>().unwrap_or(0));
        let (lo, hi) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        a.value.parse::<i64>().is_ok_and(|v| (lo..=hi).contains(&v))
    } else {
        rule.split('|').any(|v| v == a.value)
    };
    if !ok {
        return Err(ToolError::invalid(
            "value",
            &format!("{:?} is not allowed for {}", a.value, a.option),
            &format!("allowed: {rule}"),
        ));
    }
    let cmd = scope_cmd(Cmd::new("set-option"), a.scope, &a.target, a.global_)?
        .arg(&a.option)
        .arg(&a.value);
    c.s.hub().run(&cmd).await?;
    Ok(Done {
        done: format!("{} set to {}", a.option, a.value),
    })
}

/// `show_hooks`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShowHooks {
    /// The tmux scope.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// Global hooks.
    #[serde(default)]
    pub global_: bool,
}

/// Hooks.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Hooks {
    /// One line per hook (sandmux keeps this empty; anything else is drift).
    pub hooks: Vec<String>,
}

/// Lists hooks.
pub(crate) async fn show_hooks(c: &Call<'_>, a: ShowHooks) -> Result<Hooks, ToolError> {
    hooks(c, a.scope, &a.target, a.global_, None).await
}

/// `show-hooks` in a scope (session and server hooks are the global
/// ones in tmux 3.3), of every hook or of `name`.
async fn hooks(
    c: &Call<'_>,
    scope: Option<Scope>,
    target: &Option<String>,
    global: bool,
    name: Option<&str>,
) -> Result<Hooks, ToolError> {
    let scope = scope.filter(|s| *s != Scope::Session && *s != Scope::Server);
    let mut cmd = scope_cmd(Cmd::new("show-hooks"), scope, target, global)?;
    if let Some(n) = name {
        cmd = cmd.arg(n);
    }
    let r = c.s.hub().run(&cmd).await?;
    Ok(Hooks {
        hooks: r
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect(),
    })
}

/// `show_hook`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShowHook {
    /// Hook name, e.g. "after-new-window".
    pub hook_name: String,
    /// The tmux scope.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// The global hook.
    #[serde(default)]
    pub global_: bool,
}

/// Shows one hook.
pub(crate) async fn show_hook(c: &Call<'_>, a: ShowHook) -> Result<Hooks, ToolError> {
    option_name(&a.hook_name)?;
    hooks(c, a.scope, &a.target, a.global_, Some(&a.hook_name)).await
}

/// `show_environment`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShowEnv {
    /// Session name (global environment when omitted).
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

/// An environment.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct EnvList {
    /// Variables; a null value means "removed in this session".
    pub environment: std::collections::BTreeMap<String, Option<String>>,
}

/// Shows an environment.
pub(crate) async fn show_environment(c: &Call<'_>, a: ShowEnv) -> Result<EnvList, ToolError> {
    let cmd = if a.session_name.is_none() && a.session_id.is_none() {
        Cmd::new("show-environment").flag("-g")
    } else {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        Cmd::new("show-environment").opt("-t", &s.session_id)
    };
    let r = c.s.hub().run_checked(&cmd).await?;
    let mut env = std::collections::BTreeMap::new();
    for l in r {
        let l = String::from_utf8_lossy(&l).into_owned();
        match l.split_once('=') {
            Some((k, v)) => env.insert(k.to_string(), Some(v.to_string())),
            None => env.insert(l.trim_start_matches('-').to_string(), None),
        };
    }
    Ok(EnvList { environment: env })
}

/// `set_environment`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SetEnv {
    /// Variable name.
    pub name: String,
    /// The value to set.
    pub value: String,
    /// Session name (global when omitted).
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

/// Sets an environment variable for later panes.
pub(crate) async fn set_environment(c: &Call<'_>, a: SetEnv) -> Result<Done, ToolError> {
    text::env_name("name", &a.name, &c.s.policy)?;
    text::env_value("value", &a.value, c.s.max_input)?;
    let cmd = if a.session_name.is_none() && a.session_id.is_none() {
        Cmd::new("set-environment").flag("-g")
    } else {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        Cmd::new("set-environment").opt("-t", &s.session_id)
    };
    c.s.hub().run(&cmd.arg(&a.name).arg(&a.value)).await?;
    Ok(Done {
        done: format!("{} set", a.name),
    })
}

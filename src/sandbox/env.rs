//! Environment: every process inside sees only the profile's allowlist.
//!
//! `keep` names (a trailing `*` matches a prefix) are copied from the given
//! environment, then `set` entries are applied. tmux, sandmux, loader and
//! session-bus variables never pass, whatever the profile says (E31, T2).

use crate::profile::{schema_is_forbidden_env as forbidden, Environment};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// Builds the environment for a process inside from `from` (usually the
/// caller's own environment).
pub(crate) fn build(
    policy: &Environment,
    from: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = Vec::new();
    for (k, v) in from {
        let Ok(name) = std::str::from_utf8(k.as_bytes()) else {
            continue;
        };
        if forbidden(name) || v.as_bytes().contains(&0) {
            continue;
        }
        let keep = policy.keep.iter().any(|pat| match pat.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pat,
        });
        if keep {
            out.push((k, v));
        }
    }
    for (k, v) in &policy.set {
        if forbidden(k) {
            continue;
        }
        out.retain(|(n, _)| n.as_bytes() != k.as_bytes());
        out.push((k.into(), v.into()));
    }
    if !out.iter().any(|(k, _)| k == "PATH") {
        out.push((
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        ));
    }
    out
}

/// The environment a pane gets: what tmux hands the gate (the sandbox's own
/// environment plus variables sandmux's tools set, already checked) minus
/// every forbidden name (`TMUX`, `TMUX_PANE`, loader and bus variables), then
/// the profile's `set` entries.
pub(crate) fn gate(
    policy: &Environment,
    from: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = from
        .into_iter()
        .filter(|(k, v)| {
            std::str::from_utf8(k.as_bytes()).is_ok_and(|n| !forbidden(n))
                && !v.as_bytes().contains(&0)
        })
        .collect();
    for (k, v) in &policy.set {
        if !forbidden(k) {
            out.retain(|(n, _)| n.as_bytes() != k.as_bytes());
            out.push((k.into(), v.into()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_drops_tmux_and_loader_variables_only() {
        let policy = Environment {
            keep: vec![],
            set: [("HOME".to_string(), "/home/sandmux".to_string())].into(),
        };
        let env = vec![
            ("TMUX".into(), "x".into()),
            ("TMUX_PANE".into(), "%1".into()),
            ("LD_PRELOAD".into(), "e".into()),
            ("MY_VAR".into(), "set by a tool".into()),
            ("HOME".into(), "/root".into()),
        ];
        let out = gate(&policy, env);
        assert_eq!(
            out,
            vec![
                ("MY_VAR".into(), "set by a tool".into()),
                ("HOME".into(), "/home/sandmux".into())
            ]
        );
    }

    #[test]
    fn scrubs() {
        let policy = Environment {
            keep: vec!["PATH".into(), "LC_*".into(), "TMUX".into()],
            set: [("HOME".to_string(), "/home/sandmux".to_string())].into(),
        };
        let env = vec![
            ("PATH".into(), "/bin".into()),
            ("LC_ALL".into(), "C".into()),
            ("TMUX".into(), "/tmp/tmux-0/default,1,0".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "canary".into()),
            ("HOME".into(), "/root".into()),
        ];
        let out = build(&policy, env);
        let names: Vec<_> = out
            .iter()
            .map(|(k, _)| k.to_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["PATH", "LC_ALL", "HOME"]);
        assert_eq!(out[2].1, "/home/sandmux");
    }
}

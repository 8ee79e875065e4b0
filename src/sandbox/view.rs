//! What is shown of a compiled plan: `sandmux profile show --resolved` (the
//! policy and the whole sandbox, JSON or TOML) and the mount-view table of
//! docs/architecture.md (`sandmux __tables-doc mount-view`).

use super::plan::{self, Blueprint, From, Mode, Need, Onto, Op, Part, RunFile, Step};
use crate::profile::{FsEntry, MountKind, Policy};
use serde::Serialize;
use std::path::PathBuf;

/// The policy with the sandbox compiled from it (for a tmux server; `run`
/// writes no `tmux.conf` and makes no after-ready mount).
#[derive(Serialize)]
struct Resolved<'a> {
    #[serde(flatten)]
    policy: &'a Policy,
    plan: Blueprint,
}

/// Why the resolved profile cannot be shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ViewError {
    /// JSON serialization failed.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// TOML serialization failed.
    #[error("{0}")]
    Toml(#[from] toml::ser::Error),
    /// A value TOML cannot carry safely.
    #[error("a value holds control or reordering characters, which TOML's literal strings cannot escape; use --format json")]
    Unescapable,
    /// A format other than json or toml.
    #[error("unknown format {0:?}: use json or toml")]
    Format(String),
}

/// `profile show --resolved` in `format` (`json` or `toml`).
pub(crate) fn resolved(policy: &Policy, format: &str) -> Result<String, ViewError> {
    let r = Resolved {
        policy,
        plan: plan::compile(policy, Mode::Tmux),
    };
    match format {
        "json" => Ok(serde_json::to_string_pretty(&r)?),
        "toml" => {
            let text = toml::to_string(&r)?;
            // TOML's literal strings cannot escape: refuse what a terminal acts on.
            if text
                .split('\n')
                .any(|l| crate::term::printable(l) != l.replace('\\', "\\\\"))
            {
                return Err(ViewError::Unescapable);
            }
            Ok(text)
        }
        other => Err(ViewError::Format(other.to_string())),
    }
}

/// The mount view of the `default` profile as a markdown table, with
/// placeholders where the profile and the workspace decide.
pub(crate) fn table() -> String {
    let mut t = String::from("| # | path (inside) | step | source | attributes | if it fails |\n|---|---|---|---|---|---|\n");
    let bp = plan::compile(&sample(), Mode::Tmux);
    let steps = bp.mounts.iter().chain(bp.after_ready.iter());
    for (i, s) in steps.enumerate() {
        let path = format!("`{}`", s.path.display());
        t.push_str(&format!(
            "| {} | {}{} | {} | {} | {} | {} |\n",
            i + 1,
            path,
            note(s),
            what(&s.op),
            source(s),
            attrs(&s.op),
            need(s),
        ));
    }
    t
}

/// A policy whose host-dependent parts are placeholders.
pub(crate) fn sample() -> Policy {
    let (_, text) = crate::profile::BUILTINS[0];
    let p = crate::profile::parse("default", text).expect("built-in profiles parse");
    let entry = |path: &str, kind| FsEntry {
        path: path.into(),
        kind,
    };
    let ph = |s: &str| PathBuf::from(s);
    Policy {
        name: "default".into(),
        source: crate::profile::Source::Builtin("default".into()),
        description: p.description.clone(),
        fs: vec![
            entry("{read_only}", MountKind::ReadOnly),
            entry("{read_only symlink}", MountKind::Symlink("{target}".into())),
            entry("{read_write}", MountKind::ReadWrite),
            entry("/tmp", MountKind::Tmpfs),
            entry("{tmpfs}", MountKind::Tmpfs),
            entry("{masked}", MountKind::Masked),
        ],
        protected: vec![ph("{protected}")],
        guard: crate::profile::guard::Guard {
            git: p.workspace.git,
            names: Vec::new(),
            trees: Vec::new(),
            git_outside: vec![ph("{git dir outside}")],
            new_repositories: p.workspace.new_repositories,
            commit: Some(crate::profile::guard::CommitRepo {
                agent: ph("{state}/git/{id}/agent.git"),
                real: ph("{workspace}/.git"),
                origin: ph("{state}/git/{id}/origin"),
            }),
        },
        pinned: vec![ph("{parent of a protected path}")],
        network: p.network.clone(),
        limits: p.limits.clone(),
        environment: p.environment.clone(),
        sandbox: p.sandbox.clone(),
        best_effort: p.enforcement.best_effort.iter().copied().collect(),
        landlock_abi: None,
        workspace: ph("{workspace}"),
        layer: Some(ph("{state}/layers/{id}")),
        workspace_mode: crate::profile::WorkspaceMode::CopyOnWrite,
        workspace_fallback: None,
        on_end: crate::profile::OnEnd::Keep,
        layer_bound: (p.workspace.layer_bytes.0 .0, p.workspace.layer_files.0),
        history_bytes: 0,
        toolchains: Vec::new(),
        links: Vec::new(),
        mcp: p.mcp.clone(),
        recording: p.recording.clone(),
        credentials: vec![],
        ca_pem: None,
    }
}

/// When a step exists only in some sandboxes.
fn note(s: &Step) -> &'static str {
    match (s.part, &s.op) {
        (
            _,
            Op::File {
                content: RunFile::TmuxConf,
            },
        )
        | (Part::SocketCover | Part::Utempter, _) => " (tmux mode)",
        (
            _,
            Op::File {
                content: RunFile::ResolvConf | RunFile::Hosts,
            },
        ) => " (network `none`, `loopback`, `proxy`)",
        (Part::Etc, _) if s.path.ends_with("resolv.conf") || s.path.ends_with("hosts") => {
            " (network `none`, `loopback`, `proxy`)"
        }
        (Part::AgentRepo | Part::GitOrigin, _) => " (`git = \"commit\"`)",
        (Part::Layer, _) => " (`mode = \"copy-on-write\"`)",
        _ => "",
    }
}

/// One step in a sentence (a fallback's, in the report of the step it replaced).
pub(crate) fn describe(s: &Step) -> String {
    format!(
        "{} `{}` from {}, {}",
        what(&s.op),
        s.path.display(),
        source(s),
        attrs(&s.op)
    )
}

fn what(op: &Op) -> String {
    match op {
        Op::Tmpfs { options, .. } => format!("tmpfs `{options}`"),
        Op::Procfs { .. } => "fresh procfs".into(),
        Op::Devpts { options, .. } => format!("devpts `{options}`"),
        Op::File { .. } => "file, mode 0444".into(),
        Op::Bind { .. } => "recursive bind".into(),
        Op::Symlink { target } => format!("symlink → `{}`", target.display()),
        Op::Mask => {
            "masked: empty ro tmpfs (directory) or bind of `/run/sandmux/empty` (file)".into()
        }
        Op::Pin => "bound onto itself".into(),
        Op::Protect => "bound onto itself read-only".into(),
        Op::ReadOnly => "made read-only (not its submounts)".into(),
        Op::Overlay { dir } => format!(
            "overlayfs over the workspace's bind, writes in `{}/upper`",
            dir.display()
        ),
    }
}

fn source(s: &Step) -> String {
    let Op::Bind { from, .. } = &s.op else {
        return "—".into();
    };
    match from {
        From::Host => "the same host path".into(),
        From::HostBeneath { path } => format!("host `{}` (no symlinks)", path.display()),
        From::Binary => "the sandmux binary".into(),
        From::RundirSock => "`<rundir>/sock`".into(),
        From::Inside { path } => format!("`{}`", path.display()),
        From::Itself => "itself".into(),
    }
}

fn attrs(op: &Op) -> String {
    match op {
        Op::Tmpfs { attrs, .. }
        | Op::Procfs { attrs }
        | Op::Devpts { attrs, .. }
        | Op::Bind { attrs, .. } => attrs.to_string(),
        Op::Mask => "ro,nosuid,nodev,noexec".into(),
        Op::Pin => "nosuid,nodev".into(),
        Op::Protect => "ro,nosuid,nodev".into(),
        Op::ReadOnly => "ro".into(),
        Op::Overlay { .. } => "nosuid,nodev,userxattr".into(),
        Op::File { .. } | Op::Symlink { .. } => "—".into(),
    }
}

fn need(s: &Step) -> String {
    let skip = match (&s.op, s.need) {
        (
            Op::Bind {
                onto: Onto::IfPresent,
                ..
            },
            _,
        ) => "skipped if absent inside",
        (Op::Mask, _) => "skipped if absent on the host or inside",
        (Op::Pin | Op::Protect, _) => "skipped if absent; a symlink ends start-up",
        _ => "",
    };
    match s.need {
        Need::Required => format!("ends start-up (`{}`)", s.layer),
        Need::IfPresent => format!("{skip}; else ends start-up (`{}`)", s.layer),
        Need::BestEffort => format!("`{}` dropped if best-effort, else ends start-up", s.layer),
        Need::IfDropped => format!(
            "only if the step before is dropped; then ends start-up (`{}`)",
            s.layer
        ),
    }
}

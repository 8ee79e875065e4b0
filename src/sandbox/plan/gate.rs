//! What the pane gate reads (`gate.json`): the pane role's part of the
//! [`Blueprint`], for the view the sandbox's own files are in. Only what
//! the gate acts on: the mount steps and the other roles' rules stay out, so
//! the file stays small whatever the workspace holds.

use super::{Blueprint, HostView, Rule};
use crate::profile::{Environment, Layer, SandboxSettings};
use crate::sandbox::landlock::{Grant, Own, Role};
use crate::sandbox::net::Net;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The gate's configuration, compiled on the host from the blueprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GateConfig {
    /// The pane role's Landlock rules, for this view.
    pub rules: Vec<Rule>,
    /// The highest Landlock ABI the profile lets the sandbox use.
    pub landlock_abi: Option<u8>,
    /// The network mode and TCP ports (the self-test's probe).
    pub net: Net,
    /// What the gate keeps of a pane's environment and sets in it.
    pub environment: Environment,
    /// The layers the profile lets go.
    pub best_effort: BTreeSet<Layer>,
    /// The uid, hostname and shell.
    pub identity: SandboxSettings,
    /// Paths kept read-only in read-write trees (the self-test checks).
    pub protected: Vec<PathBuf>,
    /// The workspace (the self-test writes a probe file there).
    pub workspace: PathBuf,
    /// Where the sandbox's own files are.
    pub own: Own,
}

impl GateConfig {
    /// The gate's part of `bp`, in the mount view (`view` None) or in tmux
    /// mode's host view.
    pub(crate) fn of(bp: &Blueprint, view: Option<&HostView>) -> GateConfig {
        let (all, own) = match view {
            Some(h) => (&h.landlock, h.own.clone()),
            None => (&bp.landlock, Own::default()),
        };
        GateConfig {
            rules: all
                .iter()
                .filter(|r| r.role == Role::Pane)
                .flat_map(|r| r.rules.iter().cloned())
                .collect(),
            landlock_abi: bp.landlock_abi,
            net: bp.net.clone(),
            environment: bp.environment.clone(),
            best_effort: bp.best_effort(),
            identity: bp.identity.clone(),
            protected: bp.protected.clone(),
            workspace: bp.paths.workspace.clone(),
            own,
        }
    }

    /// The rules as the Landlock layer takes them.
    pub(crate) fn pane_rules(&self) -> Vec<(PathBuf, Grant)> {
        self.rules
            .iter()
            .map(|r| (r.path.clone(), r.grant))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{compile, host_view, Mode};
    use super::*;
    use std::path::Path;

    /// The gate gets its role's rules of its own view, and none of the
    /// mount steps (which grow with the workspace's protected paths).
    #[test]
    fn the_gate_gets_the_pane_rules_of_its_view_and_no_mount_step() {
        let policy = crate::sandbox::view::sample();
        let bp = compile(&policy, Mode::Tmux);
        let pane: Vec<Rule> = bp
            .landlock
            .iter()
            .filter(|r| r.role == Role::Pane)
            .flat_map(|r| r.rules.clone())
            .collect();
        let g = GateConfig::of(&bp, None);
        assert!(!pane.is_empty());
        assert_eq!(g.rules, pane);
        assert_eq!(g.own, Own::default());
        assert_eq!(g.best_effort, bp.best_effort());
        let json = serde_json::to_string(&g).unwrap();
        assert!(
            !json.contains("\"mounts\"") && !json.contains("\"op\""),
            "{json}"
        );
        let hv = host_view(&policy, Path::new("/srv/v"), Path::new("/srv/sandmux"));
        let g = GateConfig::of(&bp, Some(&hv));
        assert_eq!(g.own, hv.own);
        assert!(g.rules.iter().any(|r| r.path.starts_with("/srv/v")));
        assert!(!g.rules.iter().any(|r| r.path.starts_with("/run/sandmux")));
    }
}

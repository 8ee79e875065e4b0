//! The guard's start for one instance ([`start_for`]): the stale sweep of
//! earlier instances, the watch, and in commit mode the agent's own
//! repository. What the guard adds to the sandbox's view comes back as a
//! value ([`Made`]); `supervisor::launch` puts it into the policy the
//! sandbox is built from, and nothing else does.

use super::quarantine::state_dir;
use super::sweep::sweep_stale;
use super::watch::{say_stale, Watch};
use super::GitMode;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// What the guard adds to the sandbox's policy (commit mode only): `.git`'s
/// control kept read-only, its object store pinned, the agent's repository.
#[derive(Debug, Default)]
pub(crate) struct Made {
    /// Paths kept read-only inside the workspace.
    pub(crate) protected: Vec<PathBuf>,
    /// Directories bound onto themselves so they cannot be renamed away.
    pub(crate) pinned: Vec<PathBuf>,
    /// The agent's repository.
    pub(crate) commit: Option<crate::profile::guard::CommitRepo>,
}

/// Starts the watch for a resolved policy and says what a stale sweep took;
/// a guard that cannot start refuses the instance (fail closed). With no
/// tree to guard (a copy-on-write workspace and no other writable tree) there
/// is no watch: no manifest, no quarantine, only the stale sweep of earlier
/// instances.
pub(crate) fn start_for(
    policy: &crate::profile::Policy,
    id: &str,
) -> Result<(Option<Watch>, Made), crate::sandbox::StartError> {
    let refuse = |e: String| crate::sandbox::StartError {
        layer: None,
        message: format!("the workspace guard cannot start: {e}"),
        code: Some(crate::sandbox::EXIT_USAGE),
        layers: vec![],
    };
    // A tree bigger than the walk at start reads: the end sweep could not
    // tell what the agent added below (an earlier agent can fill a tree to
    // get there). An agent that fills it during this instance makes the end
    // sweep stop too; that one says so (threat model, live mode).
    if let Some(t) = policy.guard.trees.iter().find(|t| !t.at_start.complete) {
        return Err(refuse(format!(
            "{} holds more than {} entries, more than the guard's walk at start reads, so it could not tell at the end what the agent added below; run it copy-on-write (--workspace-mode copy-on-write, the built-ins' default), or make the tree smaller",
            crate::term::printable(&t.root.to_string_lossy()),
            super::scan::MAX_ENTRIES
        )));
    }
    if policy.guard.trees.is_empty() && policy.guard.git != GitMode::Commit {
        let state = state_dir(&[]).map_err(|e| refuse(e.to_string()))?;
        say_stale(&sweep_stale(&state));
        return Ok((None, Made::default()));
    }
    // Where the mount layer may be missing, keep copies to restore from.
    let snapshots = if policy.best_effort.contains(&crate::profile::Layer::Mount) {
        policy
            .guard
            .trees
            .iter()
            .filter_map(|t| {
                let repos = match policy.guard.git {
                    GitMode::Unguarded => BTreeSet::new(),
                    _ => t.at_start.repos.clone(),
                };
                super::restore::Snapshot::take(&t.root, &policy.protected, &repos)
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut w = Watch::start(&policy.guard, snapshots, id, Some(policy))
        .map_err(|e| refuse(e.to_string()))?;
    let mut made = Made::default();
    if policy.guard.git == GitMode::Commit {
        let t = &policy.guard.trees[0];
        let roots: Vec<PathBuf> = policy.guard.trees.iter().map(|t| t.root.clone()).collect();
        let state = state_dir(&roots).map_err(|e| refuse(e.to_string()))?;
        let c = super::commit::prepare(&state, id, &t.root, &t.shape)
            .map_err(|e| refuse(e.to_string()))?;
        let at = t.root.join(".git");
        made.protected = ["config", "hooks", "info", "objects/info"]
            .iter()
            .map(|p| at.join(p))
            .collect();
        made.pinned = vec![at.join("objects")];
        w.commit_note = Some(format!(
            "the agent's commits are in {}; bring them in with: sandmux git fetch {id}",
            c.agent.display()
        ));
        made.commit = Some(c);
    }
    say_stale(&w.swept_stale);
    Ok((Some(w), made))
}

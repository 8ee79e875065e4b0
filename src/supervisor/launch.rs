//! One launch path for `run`, `shell` and `serve` (and `check`'s probe).
//!
//! 1. [`Credentialed::open`]: the resolved policy's credentials are read
//!    (and taken out of this process's environment) before any other
//!    process exists. The resolved policy is never changed after this.
//! 2. [`Credentialed::placed`] makes the runtime directory (where `run`
//!    makes its cgroup first), then [`Placed::host`] the workspace guard's
//!    watch and the workspace's layer; each step returns what it made as a
//!    value (`guard::start::Made`, `layer::Made`, the vault).
//! 3. [`derive`]: the policy the sandbox is built from is derived once from
//!    the resolved policy and those values. It is the only code that
//!    writes the host-made parts (`layer`, `ca_pem`, the placeholders, a
//!    copy's paths, commit mode's paths): a test keeps it so.
//! 4. The sandbox is planned from a [`Launch`] and started: a command
//!    (`run`) or a tmux server (`Instance::start`).
//! 5. The end: the layer's [`End`] is decided from what happened, never by
//!    changing the policy (the CLI's `after_end` does what it says).
//!
//! What differs between the commands is a parameter: what the instance
//! serves (`Serves`), who refreshes credentials ([`Refresh`]), what ends it.

use crate::guard::watch::Watch;
use crate::profile::{OnEnd, Policy};
use crate::proxy::credentials::Vault;
use crate::sandbox::StartError;
use crate::supervisor::rundir::{Rundir, Serves};
use std::path::Path;
use std::sync::Arc;

/// Who refreshes a `from_command` credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// This process, from now (`run`, `shell`: not confined).
    Here,
    /// `serve`, once it has confined itself (through its broker).
    Confined,
}

/// Step 1 done: the resolved policy and its credentials.
pub(crate) struct Credentialed {
    resolved: Arc<Policy>,
    vault: Option<Arc<Vault>>,
    /// `serve --resume` / `--fork`: the kept layer the workspace goes on from.
    from: Option<super::layer_from::LayerFrom>,
}

impl Credentialed {
    /// Reads the credentials of `resolved` (step 1).
    pub(crate) fn open(
        resolved: Policy,
        refresh: Refresh,
    ) -> Result<Credentialed, crate::proxy::credentials::CredError> {
        let vault = crate::proxy::credentials::open(&resolved)?;
        if let (Some(v), Refresh::Here) = (&vault, refresh) {
            v.start_here(&resolved.credentials);
        }
        Ok(Credentialed {
            resolved: Arc::new(resolved),
            vault,
            from: None,
        })
    }

    /// Step 1 without reading any credential, for `check`: it probes the
    /// layers and never holds a secret.
    pub(crate) fn unread(resolved: Policy) -> Credentialed {
        Credentialed {
            resolved: Arc::new(resolved),
            vault: None,
            from: None,
        }
    }

    /// The workspace goes on from the kept layer `from` (`serve --resume`,
    /// `--fork`) rather than from a fresh layer.
    pub(crate) fn going_on(mut self, from: Option<super::layer_from::LayerFrom>) -> Self {
        self.from = from;
        self
    }

    /// The policy as resolved.
    pub(crate) fn resolved(&self) -> &Policy {
        &self.resolved
    }

    /// The credentials' vault (None without credentials).
    pub(crate) fn vault(&self) -> Option<&Arc<Vault>> {
        self.vault.as_ref()
    }

    /// Step 2a: the instance's runtime directory (`run` makes its cgroup
    /// there before anything else is made).
    pub(crate) fn placed(self, id: &str, serves: Serves) -> Result<Placed, StartError> {
        let rundir = Rundir::create(id, serves).map_err(|e| StartError::internal(e.to_string()))?;
        crate::log::step("launch: runtime directory");
        Ok(Placed {
            creds: self,
            rundir,
        })
    }

    /// Steps 2 and 3 at once ([`Credentialed::placed`], [`Placed::host`]).
    pub(crate) fn host(self, id: &str, serves: Serves) -> Result<Launch, StartError> {
        self.placed(id, serves)?.host()
    }
}

/// Step 2a done: the runtime directory exists.
pub(crate) struct Placed {
    creds: Credentialed,
    /// The instance's runtime directory.
    pub(crate) rundir: Rundir,
}

impl Placed {
    /// The policy as resolved, and the runtime directory to work in.
    pub(crate) fn parts(&mut self) -> (&Policy, &mut Rundir) {
        (&self.creds.resolved, &mut self.rundir)
    }

    /// Step 2b: the guard's watch and the workspace's layer, each returned
    /// as a value; then the sandbox's policy derived from them (step 3).
    pub(crate) fn host(self) -> Result<Launch, StartError> {
        let Placed { creds, rundir } = self;
        let (guard, guarded) = crate::guard::start::start_for(&creds.resolved, &rundir.id)?;
        crate::log::step("launch: the guard's watch");
        let layer = super::layer::create(&creds.resolved, &rundir.id, creds.from.as_ref())
            .map_err(layer_refused)?;
        crate::log::step("launch: the copy-on-write layer");
        let policy = derive(
            &creds.resolved,
            creds.vault.as_deref(),
            &guarded,
            layer.as_ref(),
        );
        Ok(Launch {
            resolved: creds.resolved,
            policy,
            rundir,
            vault: creds.vault,
            guard,
            layer: layer.map(|l| l.live),
        })
    }
}

/// Steps 1–3 done: everything the sandbox is planned from.
pub(crate) struct Launch {
    /// The policy as resolved.
    pub(crate) resolved: Arc<Policy>,
    /// The policy the sandbox is built from ([`derive`]).
    pub(crate) policy: Policy,
    /// The instance's runtime directory.
    pub(crate) rundir: Rundir,
    /// The credentials' vault.
    pub(crate) vault: Option<Arc<Vault>>,
    /// The workspace guard's watch.
    pub(crate) guard: Option<Watch>,
    /// The workspace layer's lock, held while the instance lives.
    pub(crate) layer: Option<super::layer::Live>,
}

/// Step 3: the policy the sandbox is built from, derived from the resolved
/// policy and what the host made. The resolved policy is not changed.
pub(crate) fn derive(
    resolved: &Policy,
    vault: Option<&Vault>,
    guarded: &crate::guard::start::Made,
    layer: Option<&super::layer::Made>,
) -> Policy {
    let mut p = resolved.clone();
    if let Some(v) = vault {
        p.environment.set.extend(v.inside_env());
        p.ca_pem = Some(v.tls.ca_pem());
    }
    p.protected.extend(guarded.protected.iter().cloned());
    if !guarded.pinned.is_empty() {
        p.pinned.extend(guarded.pinned.iter().cloned());
        p.pinned.sort_by_key(|d| d.components().count());
    }
    p.guard.commit = guarded.commit.clone();
    if let Some(l) = layer {
        if let Some(copy) = &l.copy {
            work_in_copy(&mut p, copy);
        }
        p.layer = Some(l.dir.clone());
    }
    p
}

/// The sandbox of a copy workspace works on the copy: the workspace's
/// path becomes the copy's in its entries, its environment and its start
/// directory (the layer's `meta.json` keeps the host's).
fn work_in_copy(policy: &mut Policy, copy: &Path) {
    let host = policy.workspace.clone();
    let moved = |p: &Path| p.strip_prefix(&host).ok().map(|rel| copy.join(rel));
    for e in policy.fs.iter_mut() {
        if let Some(p) = moved(&e.path) {
            e.path = p;
        }
    }
    for v in policy.environment.set.values_mut() {
        // A path at or below the workspace, by whole components.
        if let Some(p) = moved(Path::new(v.as_str())) {
            *v = p.to_string_lossy().into_owned();
        }
    }
    policy.workspace = copy.to_path_buf();
}

/// What happens to the layer at the end, decided from what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// As `--on-end` (the profile's `on_end`) says.
    AsAsked(OnEnd),
    /// The layer's bound ended the sandbox: the layer is kept as it was,
    /// whatever `--on-end` said.
    KeptOverBound,
}

impl End {
    /// What the layer's end does.
    pub(crate) fn on_end(self) -> OnEnd {
        match self {
            End::AsAsked(o) => o,
            End::KeptOverBound => OnEnd::Keep,
        }
    }
}

/// The layer's failure as a start-up error: a refused `--resume ID` or
/// `--fork ID` exits with the usage status, anything else as sandmux's own.
fn layer_refused(e: super::layer::LayerError) -> StartError {
    let code = e.refuses_input().then_some(crate::sandbox::EXIT_USAGE);
    StartError {
        code,
        ..StartError::internal(format!("the workspace's layer: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The resolved policy is changed by no one after resolution: outside
    /// `profile/` (which resolves it) and this file (which derives the
    /// sandbox's from it), no function takes a policy to change it and no
    /// line writes a host-made part into one. `profile show`'s printed plan
    /// is the one exception: it names where a layer would be.
    #[test]
    fn only_the_launch_completes_a_policy() {
        let writes = regex::Regex::new(concat!(
            // A function that takes a policy to change it.
            r"&mut (crate::)?(profile::)?Policy\b|mut \w+: (crate::)?(profile::)?Policy\b",
            // A policy replaced, a field written (at any depth, indexed).
            r"|(\.|^\s*)policy\s*=[^=]|\bpolicy\.[\w.\[\]]+\s*[-+]?=[^=]",
            // A field changed through a method or lent mutably.
            r"|\bpolicy\.[\w.]+\.(push|extend|insert|append|iter_mut|values_mut|get_mut|sort\w*|retain|clear|entry|take|replace|truncate|remove|dedup)\(",
            r"|&mut (\w+\.)*policy\.",
        ))
        .unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let rel = p.strip_prefix(&src).unwrap().display().to_string();
                if p.is_dir() {
                    if rel != "profile" {
                        stack.push(p);
                    }
                    continue;
                }
                let test_file = rel.ends_with("tests.rs");
                if !rel.ends_with(".rs") || test_file || rel == "supervisor/launch.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                // Unit tests at a file's end build their own policies.
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                for (n, line) in code.lines().enumerate() {
                    let line = line.split("//").next().unwrap_or("");
                    if writes.is_match(line) {
                        found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        found.retain(|f| !f.starts_with("cli/profile_cmd.rs:") || !f.contains("policy.layer ="));
        assert!(
            found.is_empty(),
            "a policy changed after resolution:\n{}",
            found.join("\n")
        );
    }
}

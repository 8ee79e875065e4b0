//! Why the supervisor's confinement (or a thread's) could not be made.

use crate::sandbox::caps::CapsError;
use crate::sandbox::seccomp::SeccompError;
use landlock::{PathFdError, RulesetError, RulesetStatus};
use std::path::PathBuf;

/// Why a Landlock ruleset, the seccomp filter or the core-dump limit could
/// not be put in place.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfineError {
    /// `no_new_privs` could not be set.
    #[error(transparent)]
    Caps(#[from] CapsError),
    /// The kernel has no Landlock.
    #[error("Landlock is not available in this kernel")]
    NoLandlock,
    /// Proxy mode without Landlock's TCP port rules.
    #[error("network mode proxy needs Landlock ABI 4 for the supervisor's TCP port rules (ABI {abi} here{capped}); without them its connections would reach every port")]
    NoPortRules { abi: u8, capped: &'static str },
    /// The ruleset could not be built or applied.
    #[error("{0}")]
    Ruleset(RulesetError),
    /// A path of the rules could not be opened.
    #[error("{}: {source}", path.display())]
    Path { path: PathBuf, source: PathFdError },
    /// A path's rule was refused.
    #[error("rule for {}: {source}", path.display())]
    Rule { path: PathBuf, source: RulesetError },
    /// A TCP port's rule was refused.
    #[error("rule for TCP port {port}: {source}")]
    Port { port: u16, source: RulesetError },
    /// The ruleset applied only in part.
    #[error("ruleset not fully enforced: {0:?}")]
    NotEnforced(RulesetStatus),
    /// The supervisor's seccomp programs could not be built.
    #[error("{0}")]
    Programs(SeccompError),
    /// A filter could not be installed on the calling thread.
    #[error("seccomp: {0}")]
    ThreadFilter(seccompiler::Error),
    /// A filter could not be installed on every thread.
    #[error("{0}")]
    AllThreads(seccompiler::Error),
    /// Core dumps could not be turned off.
    #[error("setrlimit(RLIMIT_CORE, 0): {0}")]
    NoCore(nix::Error),
}

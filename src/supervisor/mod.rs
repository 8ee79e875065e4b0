//! The host side of one instance: everything sandmux does outside the
//! sandbox for an instance's life — its generations (cgroup, plan, start),
//! the `Instance` that holds them with the runtime directory and the
//! workspace guard, and the broker that starts later generations for a
//! confined `serve`, and the copy-on-write layers (`layer`, `kept`). `run`, `shell` and `serve` all start here; `sandbox/`
//! is what runs inside, `tmux/` is tmux itself.

pub(crate) mod bound;
pub(crate) mod broker;
pub(crate) mod cgroup;
pub(crate) mod copy;
pub(crate) mod freeze;
pub(crate) mod generation;
pub(crate) mod history;
pub(crate) mod instance;
pub(crate) mod kept;
pub(crate) mod launch;
pub(crate) mod layer;
mod layer_copy;
pub(crate) mod layer_from;
pub(crate) mod nsconnect;
pub(crate) mod nssignal;
pub(crate) mod probe;
pub(crate) mod rewinder;
pub(crate) mod rundir;
pub(crate) mod systemd;

pub(crate) use generation::{make_cgroup, plan};
pub(crate) use instance::{Instance, Proof};

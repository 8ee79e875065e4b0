//! What the instance leaves for its end, and the end itself: the last OOM
//! check, the sandbox stopped (killed where it stands if frozen), the
//! reverts recorded, the questions closed, the proxy's last decisions
//! written, the audit log sealed.

use super::shared::InstanceInfo;
use super::{approvals, freeze, oom, proxy, reverts};
use crate::audit;
use crate::supervisor::Instance;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What the teardown needs once the runtime has stopped.
pub(crate) struct Leftovers {
    pub(crate) inst: Arc<std::sync::Mutex<Option<Instance>>>,
    pub(crate) oom: Option<Arc<oom::Watch>>,
    pub(crate) reverts: Option<Arc<reverts::Reverts>>,
    pub(crate) frozen: Arc<freeze::Freeze>,
    pub(crate) audit: Arc<audit::Audit>,
    /// The allowlist proxy's decisions (network mode `proxy`).
    pub(crate) flood: Arc<proxy::Flood>,
    /// Questions to a human and their grants (`[network] ask`).
    pub(crate) approvals: Arc<approvals::Approvals>,
}

/// The watchers the teardown also needs (OOM kills, reverts, the freeze,
/// the proxy's decisions); the instance joins them in `mcp`'s `hand_over`.
/// `counts` counts the proxy's decisions (the protocol's metrics).
pub(crate) fn leftovers(
    inst: &Instance,
    info: &InstanceInfo,
    audit: &Arc<audit::Audit>,
    counts: &'static dyn proxy::Counts,
) -> Leftovers {
    Leftovers {
        oom: info
            .cgroup
            .clone()
            .map(|cg| oom::Watch::new(audit.clone(), cg)),
        // Without a guarded tree there is nothing to revert, but the end's
        // warnings (where the kept layer is) still go to the audit log.
        reverts: Some(match &inst.guard {
            Some(g) => reverts::Reverts::new(audit.clone(), g.taken(), g.quarantine_dir()),
            None => reverts::Reverts::new(audit.clone(), Default::default(), PathBuf::new()),
        }),
        frozen: Arc::new(freeze::Freeze::default()),
        flood: proxy::Flood::new(audit.clone(), counts),
        approvals: approvals::Approvals::new(
            Duration::from_secs(inst.policy.mcp.ask_seconds),
            audit.clone(),
        ),
        audit: audit.clone(),
        inst: Arc::new(std::sync::Mutex::new(None)),
    }
}

/// The last step: a last OOM check, the sandbox ended (killed where it
/// stands if frozen), the reverts recorded, the audit log sealed.
pub(crate) fn teardown(left: Leftovers, code: i32) -> i32 {
    // A kill in the last second, or the one that ended the instance, is
    // recorded while the cgroup still exists.
    if let Some(w) = &left.oom {
        w.check();
    }
    let last = left.inst.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(inst) = last {
        // A frozen sandbox is killed where it stands: nothing inside runs again.
        if left.frozen.is_frozen() {
            let t = crate::supervisor::freeze::Target {
                init_pid: inst.init_pid(),
                cgroup: inst.rundir.cgroup.clone(),
            };
            let b = inst.broker.clone();
            crate::supervisor::freeze::kill(&t, &|op, pid| freeze::signals(&b, op, pid));
        }
        let taken = inst.stop();
        if let Some(r) = &left.reverts {
            r.record(&taken);
        }
    }
    left.approvals.close("the instance ended");
    left.flood.finish();
    left.audit.seal(code);
    tracing::debug!(code, "shutdown: the instance ended");
    code
}

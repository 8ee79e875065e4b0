//! `sandmux __rewind`: the rewinder itself. A fresh single-threaded
//! process (the broker started it: [`super::spawn`]) that joins the
//! sandbox's user and mount namespaces, opens the workspace there (it must
//! be the overlay), confines itself like a pane (every capability dropped,
//! `no_new_privs`, a Landlock domain: every right beneath the workspace,
//! read beneath the workspace's own tree on the host, no TCP, scoped
//! signals and abstract sockets), then takes its plan from the supervisor
//! and writes it through the merged view ([`super::merged`]).
//!
//! Not the sandbox's seccomp filter: it refuses `openat2`, which is what
//! lets every open here refuse a link. Landlock is the bound instead: what
//! the rewinder can write is the workspace, whatever it is told.

use super::merged::{apply, InsideError};
use super::{Ask, Done, Plan, LOWER_FD, MNT_FD, MOUNTINFO_FD, SOCK_FD, USER_FD};
use crate::supervisor::history::{path_of, State};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The plan's largest size (two states of at most a million entries).
const MAX_PLAN: u64 = 1 << 30;
/// `OVERLAYFS_SUPER_MAGIC`.
const OVERLAY_MAGIC: i64 = 0x794c_7630;

fn setup(what: &str) -> impl FnOnce(String) -> InsideError + '_ {
    move |e| InsideError::Setup(format!("{what}: {e}"))
}

/// The rewinder's main: 0 when the rewind was done (the supervisor has
/// its answer either way).
pub(crate) fn main(workspace: &Path, userns: bool) -> i32 {
    // SAFETY: the descriptors `spawn` placed; nothing else owns them.
    let (sock, lower, mnt, table) = unsafe {
        (
            UnixStream::from_raw_fd(SOCK_FD),
            OwnedFd::from_raw_fd(LOWER_FD),
            OwnedFd::from_raw_fd(MNT_FD),
            OwnedFd::from_raw_fd(MOUNTINFO_FD),
        )
    };
    // SAFETY: likewise, placed only with `--userns`.
    let user = userns.then(|| unsafe { OwnedFd::from_raw_fd(USER_FD) });
    // Not dumpable: no process of the sandbox's uid can ptrace or read
    // it meanwhile (Landlock refuses that across domains as well).
    let r = crate::sandbox::caps::set_nondumpable()
        .map_err(|e| setup("making the rewinder non-dumpable")(e.to_string()))
        .and_then(|()| enter(user, mnt))
        .and_then(|()| open_workspace(workspace, table))
        .and_then(|ws| confine(&ws, &lower).map(|()| ws))
        .and_then(|ws| run(&sock, &ws, &lower));
    let (ask, code) = match r {
        Ok(d) => (Ask::Done(d), 0),
        Err(e) if e.wrote_nothing() => (Ask::Refused(e.to_string()), 1),
        Err(e) => (Ask::Failed(e.to_string()), 1),
    };
    let mut line = serde_json::to_vec(&ask).unwrap_or_default();
    line.push(b'\n');
    let _ = (&sock).write_all(&line);
    code
}

/// Joins the sandbox's user namespace (full capabilities there: the
/// supervisor's uid owns it), then its mount namespace.
fn enter(user: Option<OwnedFd>, mnt: OwnedFd) -> Result<(), InsideError> {
    use nix::sched::{setns, CloneFlags};
    if let Some(u) = user {
        setns(u, CloneFlags::CLONE_NEWUSER)
            .map_err(|e| setup("joining the sandbox's user namespace")(e.to_string()))?;
    }
    setns(mnt, CloneFlags::CLONE_NEWNS)
        .map_err(|e| setup("joining the sandbox's mount namespace")(e.to_string()))?;
    std::env::set_current_dir("/").map_err(|e| setup("entering the sandbox's root")(e.to_string()))
}

/// The workspace as the panes see it; refused unless it is the overlay's
/// mount root, reached with no link followed ([`super::mountroot`]).
fn open_workspace(workspace: &Path, table: OwnedFd) -> Result<OwnedFd, InsideError> {
    let ws = super::mountroot::open(workspace, table)?;
    let fs = nix::sys::statfs::fstatfs(&ws)
        .map_err(|e| setup("reading the workspace's file system")(e.to_string()))?;
    if fs.filesystem_type().0 as i64 != OVERLAY_MAGIC {
        return Err(InsideError::Setup(
            "the workspace inside the sandbox is not the copy-on-write overlay: nothing was written"
                .into(),
        ));
    }
    Ok(ws)
}

/// No capabilities, `no_new_privs`, and a Landlock domain: every right
/// beneath `ws`, read beneath `lower`, nothing else; no TCP where the ABI
/// handles it, signals and abstract sockets scoped where it can.
fn confine(ws: &OwnedFd, lower: &OwnedFd) -> Result<(), InsideError> {
    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };
    crate::sandbox::caps::set_no_new_privs().map_err(|e| setup("no_new_privs")(e.to_string()))?;
    crate::sandbox::caps::drop_all().map_err(|e| setup("dropping capabilities")(e.to_string()))?;
    let (_, eff) = crate::sandbox::landlock::effective_abi(None);
    if eff == 0 {
        return Err(InsideError::Setup(
            "Landlock is not available: the rewinder does not run unconfined".into(),
        ));
    }
    let abi = crate::sandbox::landlock::abi_of(eff);
    let ll = |e: landlock::RulesetError| setup("Landlock")(e.to_string());
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    if eff >= 4 {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(ll)?;
    }
    if eff >= 6 {
        rs = rs.scope(Scope::from_all(abi)).map_err(ll)?;
    }
    let status = rs
        .create()
        .map_err(ll)?
        .add_rule(PathBeneath::new(ws, AccessFs::from_all(abi)))
        .map_err(ll)?
        .add_rule(PathBeneath::new(
            lower,
            AccessFs::ReadFile | AccessFs::ReadDir,
        ))
        .map_err(ll)?
        .restrict_self()
        .map_err(ll)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        s => Err(InsideError::Setup(format!("Landlock: {s:?}"))),
    }
}

/// Reads the plan, writes it, answering for each content with the
/// supervisor's descriptor.
fn run(sock: &UnixStream, ws: &OwnedFd, lower: &OwnedFd) -> Result<Done, InsideError> {
    let plan = read_plan(sock).map_err(setup("reading the plan"))?;
    let state = |m: std::collections::BTreeMap<String, crate::supervisor::history::Node>| {
        m.into_iter()
            .map(|(h, n)| {
                Ok((
                    path_of(&h).map_err(|e| InsideError::Setup(e.to_string()))?,
                    n,
                ))
            })
            .collect::<Result<State, InsideError>>()
    };
    let (target, current) = (state(plan.target)?, state(plan.current)?);
    let mut objects = |o: &str| ask_object(sock, o);
    apply(ws, lower, &target, &current, &mut objects)
}

fn read_plan(sock: &UnixStream) -> Result<Plan, String> {
    let mut len = [0u8; 8];
    let mut r = sock;
    r.read_exact(&mut len).map_err(|e| e.to_string())?;
    let len = u64::from_le_bytes(len);
    if len > MAX_PLAN {
        return Err(format!("{len} bytes, more than {MAX_PLAN}"));
    }
    let mut text = vec![0u8; len as usize];
    r.read_exact(&mut text).map_err(|e| e.to_string())?;
    serde_json::from_slice(&text).map_err(|e| e.to_string())
}

/// Asks the supervisor for object `o`; its descriptor, or None.
fn ask_object(sock: &UnixStream, o: &str) -> Option<OwnedFd> {
    let mut line = serde_json::to_vec(&Ask::Object(o.to_string())).ok()?;
    line.push(b'\n');
    (&*sock).write_all(&line).ok()?;
    match crate::supervisor::nsconnect::recv_fd(sock) {
        Ok((0, _, Some(fd))) => Some(fd),
        _ => None,
    }
}

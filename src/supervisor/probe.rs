//! Probe: what this machine's kernel offers, measured without starting a
//! sandbox (the live half of `sandmux check` is in `observe`).

use serde::Serialize;
use std::path::{Path, PathBuf};

/// Why a probe in a short-lived child failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The child could not be started (or this binary not found).
    #[error("{0}")]
    Spawn(std::io::Error),
    /// The child failed: what it said on stderr.
    #[error("{0}")]
    Child(String),
    /// `__probe-userns --overlay` without its three directories.
    #[error("three directories")]
    Usage,
    /// The user namespace's id maps could not be written.
    #[error("the user namespace's id maps: {0}")]
    IdMaps(std::io::Error),
    /// Neither a user and mount namespace nor a mount namespace alone.
    #[error("no mount namespace: unshare(CLONE_NEWUSER|CLONE_NEWNS): {user}; unshare(CLONE_NEWNS): {mount}")]
    NoMountNs { user: nix::Error, mount: nix::Error },
    /// The mounts could not be made private.
    #[error("making the mounts private: {0}")]
    Private(nix::Error),
    /// A directory could not be opened.
    #[error("{}: {source}", path.display())]
    Open { path: PathBuf, source: nix::Error },
    /// The overlay mount itself.
    #[error("no overlay of the workspace here: mount(overlay): {0}")]
    Overlay(nix::Error),
}

/// Kernel features relevant to the layers (the `Err` texts are the
/// report's: `sandmux check` prints and serialises them).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Kernel {
    /// `uname -r`.
    pub release: String,
    /// Landlock ABI (0: none).
    pub landlock_abi: u8,
    /// Whether a user namespace could be created just now.
    pub userns: Result<(), String>,
    /// Whether seccomp filtering is available.
    pub seccomp: bool,
    /// Where a cgroup can be created, or why not.
    pub cgroup: Result<String, String>,
    /// The systemd user manager that can delegate a cgroup, or exactly why
    /// there is none.
    pub systemd_user: Result<String, String>,
}

/// Measures the kernel: each feature is tried, not assumed.
pub(crate) fn kernel() -> Kernel {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = format!("sandmux-probe-{}", &crate::nonce::hex()[..8]);
    let cgroup = super::cgroup::create(&name, "probe", 64, 64 << 20).map(|cg| {
        cg.remove();
        cg.remove_instance();
        cg.place()
    });
    let systemd_user = super::systemd::detect(&super::systemd::Facts::here())
        .map(|m| format!("user bus {}", m.bus.display()))
        .map_err(|e| e.to_string());
    Kernel {
        release,
        landlock_abi: crate::sandbox::landlock::kernel_abi(),
        userns: try_userns().map_err(|e| e.to_string()),
        seccomp: crate::sandbox::seccomp::probe().is_ok()
            && std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
                .map(|s| s.contains("errno"))
                .unwrap_or(true),
        cgroup: cgroup.map_err(|e| e.to_string()),
        systemd_user,
    }
}

/// Tries `unshare(CLONE_NEWUSER)` in a short-lived child.
fn try_userns() -> Result<(), ProbeError> {
    in_child(&[])
}

/// Runs `sandmux __probe-userns ARGS` in a short-lived child (a process
/// of its own, as `unshare` needs): `Err` is what it said on stderr.
fn in_child(args: &[&std::ffi::OsStr]) -> Result<(), ProbeError> {
    let out = std::process::Command::new(std::env::current_exe().map_err(ProbeError::Spawn)?)
        .arg("__probe-userns")
        .args(args)
        .output()
        .map_err(ProbeError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ProbeError::Child(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Body of `sandmux __probe-userns`.
pub(crate) fn userns_child() -> i32 {
    match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("unshare(CLONE_NEWUSER): {e}");
            1
        }
    }
}

/// Tries, in a short-lived child with namespaces of its own, to mount the
/// copy-on-write workspace's overlay: `lower` (the workspace) under
/// `upper` and `work` (empty directories of the caller's). Nothing of the
/// mount outlives the child.
pub(crate) fn overlay(lower: &Path, upper: &Path, work: &Path) -> Result<(), ProbeError> {
    in_child(&[
        "--overlay".as_ref(),
        lower.as_os_str(),
        upper.as_os_str(),
        work.as_os_str(),
    ])
}

/// Body of `sandmux __probe-userns --overlay LOWER UPPER WORK`.
pub(crate) fn overlay_child(dirs: &[PathBuf]) -> i32 {
    match try_overlay(dirs) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn try_overlay(dirs: &[PathBuf]) -> Result<(), ProbeError> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let [lower, upper, work] = dirs else {
        return Err(ProbeError::Usage);
    };
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    match unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS) {
        Ok(()) => crate::sandbox::namespaces::write_id_maps(0, uid.as_raw(), gid.as_raw())
            .map_err(ProbeError::IdMaps)?,
        Err(user) => unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|mount| ProbeError::NoMountNs { user, mount })?,
    }
    // Nothing of this namespace's mounts may reach the host's.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(ProbeError::Private)?;
    // As the sandbox's PID 1 mounts it (`mounts/exec.rs`): each directory
    // opened first and named by its descriptor, so no path text (a comma,
    // a colon) reaches the options.
    let open = |p: &PathBuf| {
        crate::sandbox::beneath::open_root(p).map_err(|source| ProbeError::Open {
            path: p.clone(),
            source,
        })
    };
    let (l, u, w) = (open(lower)?, open(upper)?, open(work)?);
    let fd =
        |f: &std::os::fd::OwnedFd| format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        fd(&l),
        fd(&u),
        fd(&w)
    );
    mount(
        Some("overlay"),
        fd(&u).as_str(),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(ProbeError::Overlay)
}

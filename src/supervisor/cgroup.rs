//! cgroup: a per-instance cgroup with `pids.max` and a memory limit (and,
//! on v1, a directory in the `freezer` hierarchy where there is one: see
//! `freeze`).
//!
//! The supervisor creates the cgroup on the host side and writes the limits
//! (this file: the host's operations on a [`Cgroup`]); `sandmux __init` moves
//! itself in before it creates any namespace (`crate::sandbox::cgroup`: the
//! type the plan carries and that one step). In order:
//! cgroup v2 when the caller's cgroup is writable and delegates the `pids` and
//! `memory` controllers; else a transient scope with `Delegate=yes` from a
//! systemd user manager ([`super::systemd`]); else the v1 `pids` and `memory`
//! hierarchies (hybrid hosts, usually root only). Without any of them the
//! layer is missing, the reason names what each lacked, and the profile
//! decides (the built-ins mark it best-effort; RLIMIT_NPROC stays as backstop).

pub(crate) use crate::sandbox::cgroup::{Cgroup, Placement};
use std::path::{Path, PathBuf};

/// Why no cgroup could be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// No cgroup2 file system mounted.
    #[error("no cgroup2 mount")]
    NoV2Mount,
    /// This process has no v2 cgroup.
    #[error("no cgroup v2 entry in /proc/self/cgroup")]
    NoV2Entry,
    /// The parent does not hand the controllers down.
    #[error("{} does not delegate the pids and memory controllers", .0.display())]
    NotDelegated(PathBuf),
    /// No v1 hierarchy for this controller.
    #[error("no v1 {0} hierarchy")]
    NoV1(&'static str),
    /// A directory could not be made.
    #[error("create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The instance's directory could not delegate the controllers.
    #[error("delegate pids and memory below {}: {source}", path.display())]
    Delegate {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The v2 limits could not be written in this directory.
    #[error("write limits in {}: {source}", path.display())]
    Limits {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A v1 limit file could not be written.
    #[error("write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The systemd user manager gave no delegated scope.
    #[error("{0}")]
    Systemd(&'static super::systemd::SystemdError),
    /// None of the three ways worked; each says why.
    #[error("no writable cgroup: v2: {v2}; systemd: {systemd}; v1: {v1}")]
    Nowhere {
        v2: Box<CgroupError>,
        systemd: Box<CgroupError>,
        v1: Box<CgroupError>,
    },
}

fn own_path(controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        match controller {
            None if ctrls.is_empty() => return Some(path.to_string()),
            Some(c) if ctrls.split(',').any(|x| x == c) => return Some(path.to_string()),
            _ => {}
        }
    }
    None
}

fn mountpoint(fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in text.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split(' ');
        if r.next()? != fstype {
            continue;
        }
        let super_opts = r.nth(1).unwrap_or("");
        if let Some(o) = option {
            if !super_opts.split(',').any(|x| x == o) {
                continue;
            }
        }
        return left.split(' ').nth(4).map(PathBuf::from);
    }
    None
}

fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::write(p, v)
}

/// The cgroup2 mount point.
pub(crate) fn v2_mount() -> Option<PathBuf> {
    mountpoint("cgroup2", None)
}

/// Creates a cgroup with the limits, or says why it cannot: `name` below
/// the instance's directory `instance` (made when missing).
pub(crate) fn create(
    instance: &str,
    name: &str,
    pids: u64,
    memory: u64,
) -> Result<Cgroup, CgroupError> {
    let at = Place { instance, name };
    let own = own_v2_dir().and_then(|p| try_v2(&p, &at, pids, memory));
    let Err(own) = own else { return own };
    let scoped = super::systemd::delegated_scope()
        .map_err(CgroupError::Systemd)
        .and_then(|scope| {
            let mut cg = try_v2(&scope, &at, pids, memory)?;
            cg.scope = scope.file_name().map(|n| n.to_string_lossy().into_owned());
            Ok(cg)
        });
    let Err(scoped) = scoped else { return scoped };
    try_v1(&at, pids, memory).map_err(|v1| CgroupError::Nowhere {
        v2: Box::new(own),
        systemd: Box::new(scoped),
        v1: Box::new(v1),
    })
}

/// This process's own cgroup v2 directory.
fn own_v2_dir() -> Result<PathBuf, CgroupError> {
    let mnt = v2_mount().ok_or(CgroupError::NoV2Mount)?;
    let own = own_path(None).ok_or(CgroupError::NoV2Entry)?;
    Ok(mnt.join(own.trim_start_matches('/')))
}

/// Where a cgroup goes: `name` in the directory `instance`.
struct Place<'a> {
    instance: &'a str,
    name: &'a str,
}

/// Makes `parent/instance` if missing; with `v2`, lets the pids and memory
/// controllers reach its children (it holds no process itself).
fn instance_dir(parent: &Path, instance: &str, v2: bool) -> Result<PathBuf, CgroupError> {
    let dir = parent.join(instance);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CgroupError::Create { path: dir, source }),
    }
    if v2 {
        if let Err(source) = write(&dir.join("cgroup.subtree_control"), "+pids +memory") {
            return Err(CgroupError::Delegate { path: dir, source });
        }
    }
    Ok(dir)
}

fn try_v2(parent: &Path, at: &Place, pids: u64, memory: u64) -> Result<Cgroup, CgroupError> {
    let controllers =
        std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    if !(controllers.split_whitespace().any(|c| c == "pids")
        && controllers.split_whitespace().any(|c| c == "memory"))
    {
        return Err(CgroupError::NotDelegated(parent.to_path_buf()));
    }
    let inst = instance_dir(parent, at.instance, true)?;
    let dir = inst.join(at.name);
    let mut cg = Cgroup {
        dirs: vec![],
        version: "v2".into(),
        scope: None,
        instance: vec![inst],
    };
    if let Err(source) = std::fs::create_dir(&dir) {
        cg.remove_instance();
        return Err(CgroupError::Create { path: dir, source });
    }
    cg.dirs.push(dir.clone());
    let res = write(&dir.join("pids.max"), &pids.to_string())
        .and_then(|_| write(&dir.join("memory.max"), &memory.to_string()))
        .and_then(|_| write(&dir.join("memory.swap.max"), "0").or(Ok(())));
    if let Err(source) = res {
        cg.remove();
        cg.remove_instance();
        return Err(CgroupError::Limits { path: dir, source });
    }
    Ok(cg)
}

fn try_v1(at: &Place, pids: u64, memory: u64) -> Result<Cgroup, CgroupError> {
    let mut dirs = Vec::new();
    let mut cg = Cgroup {
        dirs: vec![],
        version: "v1".into(),
        scope: None,
        instance: vec![],
    };
    let fail = |cg: &Cgroup, e: CgroupError| {
        cg.remove();
        cg.remove_instance();
        Err(e)
    };
    for (ctrl, file, value) in [
        ("pids", "pids.max", pids),
        ("memory", "memory.limit_in_bytes", memory),
    ] {
        let mnt = mountpoint("cgroup", Some(ctrl)).ok_or(CgroupError::NoV1(ctrl))?;
        let own = own_path(Some(ctrl)).unwrap_or_else(|| "/".into());
        let inst = match instance_dir(&mnt.join(own.trim_start_matches('/')), at.instance, false) {
            Ok(i) => i,
            Err(e) => return fail(&cg, e),
        };
        cg.instance.push(inst.clone());
        let dir = inst.join(at.name);
        if let Err(source) = std::fs::create_dir(&dir) {
            return fail(&cg, CgroupError::Create { path: dir, source });
        }
        dirs.push(dir.clone());
        cg.dirs = dirs.clone();
        if let Err(source) = write(&dir.join(file), &value.to_string()) {
            let path = dir.join(file);
            return fail(&cg, CgroupError::Write { path, source });
        }
    }
    // A directory in the freezer hierarchy too, where there is one (for
    // `sandmux freeze`; without it a freeze stops the processes by signal).
    if let Some(mnt) = mountpoint("cgroup", Some("freezer")) {
        let own = own_path(Some("freezer")).unwrap_or_else(|| "/".into());
        if let Ok(inst) = instance_dir(&mnt.join(own.trim_start_matches('/')), at.instance, false) {
            cg.instance.push(inst.clone());
            let dir = inst.join(at.name);
            if std::fs::create_dir(&dir).is_ok() {
                dirs.push(dir);
                cg.dirs = dirs;
            }
        }
    }
    Ok(cg)
}

impl Cgroup {
    /// Kills everything left (v2 `cgroup.kill`; in a v1 freezer directory
    /// each process, then a thaw, so a frozen one dies), then removes the
    /// directories.
    pub(crate) fn remove(&self) {
        for d in &self.dirs {
            let _ = write(&d.join("cgroup.kill"), "1");
            if d.join("freezer.state").exists() {
                super::freeze::kill_v1(d);
            }
            for _ in 0..50 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(10))
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Removes the instance's directories (once every generation's is gone).
    pub(crate) fn remove_instance(&self) {
        for d in &self.instance {
            for _ in 0..50 {
                match std::fs::remove_dir(d) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
    }

    /// Number of OOM kills recorded so far (v2 memory.events, v1 memory.oom_control).
    pub(crate) fn oom_kills(&self) -> u64 {
        for d in &self.dirs {
            for (f, key) in [
                ("memory.events", "oom_kill"),
                ("memory.oom_control", "oom_kill"),
            ] {
                if let Ok(t) = std::fs::read_to_string(d.join(f)) {
                    // Whole keys only: `oom_kill_disable` and `oom_group_kill`
                    // share the prefix.
                    for l in t.lines() {
                        if let Some((k, v)) = l.split_once(' ') {
                            if k == key {
                                return v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_reads_whole_keys() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroup {
            dirs: vec![d.path().to_path_buf()],
            version: "v1".into(),
            scope: None,
            instance: vec![],
        };
        // v1 lists oom_kill_disable before oom_kill.
        std::fs::write(
            d.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills(), 3);
        // v2 has oom_group_kill beside oom_kill, and wins when present.
        std::fs::write(
            d.path().join("memory.events"),
            "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills(), 2);
    }
}

//! Whether sandmux runs inside a container, and the fixes that are right
//! there: a refusal in a container comes from the runtime's confinement (its
//! seccomp profile, its masked `/proc`), so the fix is a runtime flag, not a
//! sysctl. Both runtimes' flags are named: the runtime cannot be told apart
//! reliably from inside. Which fix applies is decided by what refused the
//! step ([`Refusal`], said by the step that failed), never by the text of
//! its message.

use super::report::Refusal;
use crate::profile::Layer;
use std::path::Path;

/// The seccomp flag: the profile file shipped with sandmux (docs/container.md).
const SECCOMP: &str =
    "--security-opt seccomp=/path/to/sandmux/container/seccomp.json (podman and docker)";
/// The flags that unmask `/proc`.
const UNMASK: &str =
    "--security-opt unmask=/proc/* (podman) or --security-opt systempaths=unconfined (docker)";

/// What says this process runs in a container, if anything does.
pub(crate) fn detected() -> Option<&'static str> {
    detected_in(Path::new("/"))
}

fn detected_in(root: &Path) -> Option<&'static str> {
    if root.join("run/.containerenv").exists() {
        return Some("/run/.containerenv");
    }
    if root.join(".dockerenv").exists() {
        return Some("/.dockerenv");
    }
    let cg = std::fs::read_to_string(root.join("proc/1/cgroup")).unwrap_or_default();
    let marks = ["/docker", "/libpod", "/containerd", "/kubepods", "/lxc/"];
    cg.lines()
        .any(|l| marks.iter().any(|m| l.contains(m)))
        .then_some("/proc/1/cgroup")
}

/// The fix for `layer` unavailable in a container, if it differs from the
/// host's: a namespace refused with EPERM, as a runtime's seccomp profile
/// refuses it (a host's limits give other answers: `user.max_user_namespaces
/// = 0` is ENOSPC, so its sysctl fix stays).
pub(crate) fn unavailable_fix(layer: Layer, refused: Option<Refusal>) -> Option<String> {
    let namespace = matches!(
        layer,
        Layer::Userns | Layer::Mount | Layer::Pid | Layer::Ipc | Layer::Uts | Layer::Net
    );
    (namespace && refused == Some(Refusal::NamespacesEperm)).then(|| format!(
        "the container runtime's seccomp profile refuses new namespaces (docker's default does): run the container with {SECCOMP}, or use the 'container' profile (see docs/container.md)"
    ))
}

/// The fix for `layer` failing to apply, refused by `refused`, in a
/// container, if the runtime is the cause.
pub(crate) fn applying_fix(layer: Layer, refused: Option<Refusal>) -> Option<String> {
    match (layer, refused?) {
        (Layer::Pid | Layer::Mount, Refusal::FreshProcfs) => Some(format!(
            "the container runtime masks parts of /proc, so the kernel refuses a fresh procfs: run the container with {UNMASK} (see docs/container.md for what it loosens)"
        )),
        (Layer::Mount, Refusal::NoMountNamespace) => Some(format!(
            "the container runtime's seccomp profile refuses the namespaces: run the container with {SECCOMP} and {UNMASK} (see docs/container.md)"
        )),
        (Layer::Uts, Refusal::Sethostname) => Some(format!(
            "the container runtime's seccomp profile refuses sethostname: run the container with {SECCOMP}, or use the 'container' profile (uts is best-effort there)"
        )),
        _ => None,
    }
}

/// The fix for the copy-on-write layer's overlay refused, anywhere: the
/// layers' directory is on a file system overlayfs cannot take as an upper
/// layer (a container's own root is overlayfs itself).
pub(crate) fn layer_fix(refused: Option<Refusal>) -> Option<String> {
    (refused == Some(Refusal::Overlay)).then(|| {
        "the copy-on-write layer lives in $XDG_STATE_HOME/sandmux/layers, and overlayfs cannot use that file system (a container's own root, NFS): set XDG_STATE_HOME to a directory on a local file system (in a container, a volume), or run with --workspace-mode live (docs/container.md)".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_reads_the_runtimes_marks() {
        let d = tempfile_dir();
        assert_eq!(detected_in(&d), None);
        std::fs::create_dir_all(d.join("proc/1")).unwrap();
        std::fs::write(d.join("proc/1/cgroup"), "0::/user.slice/session-1.scope\n").unwrap();
        assert_eq!(detected_in(&d), None);
        std::fs::write(d.join("proc/1/cgroup"), "3:pids:/docker/0123abcd\n").unwrap();
        assert_eq!(detected_in(&d), Some("/proc/1/cgroup"));
        std::fs::write(d.join(".dockerenv"), "").unwrap();
        assert_eq!(detected_in(&d), Some("/.dockerenv"));
        std::fs::create_dir_all(d.join("run")).unwrap();
        std::fs::write(d.join("run/.containerenv"), "").unwrap();
        assert_eq!(detected_in(&d), Some("/run/.containerenv"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn container_fixes_name_runtime_flags_not_sysctls() {
        let eperm = Some(Refusal::NamespacesEperm);
        let u = unavailable_fix(Layer::Userns, eperm).unwrap();
        assert!(u.contains("seccomp=") && !u.contains("sysctl"), "{u}");
        let m = applying_fix(Layer::Mount, Some(Refusal::FreshProcfs)).unwrap();
        assert!(
            m.contains("unmask=/proc/*") && m.contains("systempaths=unconfined"),
            "{m}"
        );
        assert!(applying_fix(Layer::Mount, None).is_none());
        assert!(applying_fix(Layer::Uts, Some(Refusal::FreshProcfs)).is_none());
        assert!(unavailable_fix(Layer::Userns, None).is_none());
        assert!(unavailable_fix(Layer::Landlock, eperm).is_none());
        assert!(layer_fix(Some(Refusal::Overlay)).is_some() && layer_fix(None).is_none());
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("smx-ctr-detect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

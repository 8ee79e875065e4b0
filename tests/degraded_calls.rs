//! E32 (silent degradation), continued from `tests/degraded.rs`: the start-up
//! calls a container runtime's seccomp profile may refuse, each refused for
//! real by a filter the test installs — `seccomp(2)` itself, `keyctl`,
//! `close_range`. A required layer refuses to start (exit 3, the layer named,
//! one `fix:` line) and runs nothing; the opt-in starts and reports the layer
//! dropped; descriptors are closed one by one where `close_range` is refused.
//!
//! Every case runs both as root and as an unprivileged uid (CI re-runs this
//! binary as 65534).

use crate::common;
use crate::degraded_env;
use common::*;
use degraded_env::*;
use sandmux::testing::Layer;
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// No seccomp filtering: installing a filter fails with EINVAL.
fn no_seccomp_case<'a>(opt: &'a Path) -> Case<'a> {
    Case {
        env: Env::NoSeccomp,
        layer: Layer::Seccomp,
        required: "default",
        opt_in: opt,
        baseline: opt,
        degraded: &["seccomp", "supervisor"],
    }
}

/// The default profile with the cgroup, seccomp and supervisor layers best
/// effort, saved in `dir`.
fn no_seccomp_opt_in(dir: &Path) -> PathBuf {
    profile_with(
        dir,
        "noseccomp",
        "default",
        &["cgroup", "seccomp", "supervisor"],
        None,
    )
}

#[test]
fn no_seccomp_fails_closed_and_run_starts_with_the_opt_in() {
    // Positive control, on a thread of our own: after the filter no other
    // filter can be installed.
    let r = std::thread::spawn(|| {
        install(&no_seccomp_filter()).expect("install filter");
        install(&landlock_enosys_filter())
    })
    .join()
    .unwrap();
    assert!(r.is_err(), "a filter could still be installed");

    let (ws, dir, tmp) = scratch();
    let opt = no_seccomp_opt_in(dir.path());
    let c = no_seccomp_case(&opt);
    assert_refuses(&c, &ws, tmp.path());
    assert_opt_in_runs(&c, &ws, tmp.path());
    // Observed from inside: the command has only the test's own filter, none of sandmux's.
    let grep = ["grep", "^Seccomp_filters:", "/proc/self/status"];
    let o = run_in(
        Env::NoSeccomp,
        tmp.path(),
        run(ws.path()).profile(&opt).cmd(grep),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let filters = String::from_utf8_lossy(&o.stdout);
    assert_eq!(filters.split_whitespace().nth(1), Some("1"), "{}", text(&o));
}

/// With "seccomp" in best_effort a tmux instance starts without seccomp too
/// (PID 1 goes without the filter it cannot install), and the live probe
/// observes the missing filter.
#[test]
fn no_seccomp_opt_in_starts_a_tmux_instance() {
    let (ws, dir, tmp) = scratch();
    let opt = no_seccomp_opt_in(dir.path());
    let (base, v) = assert_opt_in_reports(&no_seccomp_case(&opt), &ws, tmp.path());
    assert_eq!(observation(&v, "seccomp")["passed"], false, "{v:#}");
    // The kernel section tries a filter rather than reading a flag.
    assert_eq!(base["kernel"]["seccomp"], true, "{base:#}");
    assert_eq!(v["kernel"]["seccomp"], false, "{v:#}");
}

/// A container runtime's profile refuses `keyctl`: the keyring layer is
/// required by default (refused, named), and dropped and reported with the
/// opt-in (the `container` built-in's).
#[test]
fn no_keyring_fails_closed_and_the_opt_in_reports_it() {
    let (ws, dir, tmp) = scratch();
    let opt = profile_with(
        dir.path(),
        "nokeyring",
        "default",
        &["cgroup", "keyring"],
        None,
    );
    let c = Case {
        env: Env::NoKeyring,
        layer: Layer::Keyring,
        required: "default",
        opt_in: &opt,
        baseline: &opt,
        degraded: &["keyring"],
    };
    assert_case(&c, &ws, tmp.path());
}

/// `close_range` refused: every inherited descriptor is still closed at
/// exec, one by one. The control: the same descriptor reaches a plain child.
#[test]
fn inherited_descriptors_close_where_close_range_is_refused() {
    let (ws, _dir, tmp) = scratch();
    let secret = tmp.path().join("host-secret");
    std::fs::write(&secret, "s").unwrap();
    let list = |program: &OsStr, args: &[&str]| {
        let f = std::fs::File::open(&secret).unwrap();
        let mut c = wrap(Env::NoCloseRange, tmp.path(), program, args);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: dup2 onto fd 47 (without close-on-exec) between fork and exec.
        unsafe {
            c.pre_exec(move || match libc::dup2(raw, 47) {
                47 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
        let o = c.output().expect("spawn");
        drop(f);
        o
    };
    let ls = ["-c", "ls /proc/self/fd"];
    let plain = list(OsStr::new("sh"), &ls);
    assert!(
        text(&plain).split_whitespace().any(|f| f == "47"),
        "control: {}",
        text(&plain)
    );
    let args = run(ws.path())
        .profile("default")
        .cmd(["sh", "-c", "ls /proc/self/fd"])
        .args();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
    let o = list(bin().as_os_str(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let fds: Vec<&str> = std::str::from_utf8(&o.stdout)
        .unwrap()
        .split_whitespace()
        .collect();
    assert!(
        fds.iter().all(|f| ["0", "1", "2", "3"].contains(f)),
        "{fds:?}"
    );
}

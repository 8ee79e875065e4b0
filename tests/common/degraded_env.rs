//! The degraded environments of `tests/degraded.rs` and
//! `tests/degraded_calls.rs`, each built for real (a seccomp filter, a user
//! namespace, a covered cgroup mount), and the assertions every case shares.
#![allow(dead_code)]

use crate::common::*;
use sandmux::testing::Layer;
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where sandmux (or a control program) is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Env {
    /// As the test itself runs.
    Plain,
    /// Under a seccomp filter (installed with `pre_exec`, after no_new_privs)
    /// that makes the three Landlock syscalls fail with ENOSYS, as on a kernel
    /// without Landlock.
    NoLandlock,
    /// Inside `unshare --user --map-root-user`, after writing 0 to that
    /// namespace's `user.max_user_namespaces`: no nested user namespace.
    NoUserns,
    /// Inside a new mount namespace (as non-root: a new user + mount
    /// namespace) where an empty read-only tmpfs covers `/sys/fs/cgroup`.
    NoCgroupMount,
    /// Under a seccomp filter that makes `seccomp(2)` fail with ENOSYS and
    /// `prctl(PR_SET_SECCOMP)` with EINVAL, as on a kernel without seccomp
    /// filtering: no further filter can be installed.
    NoSeccomp,
    /// Under a seccomp filter that makes `keyctl` fail with EPERM, as
    /// docker's and podman's default profiles do.
    NoKeyring,
    /// Under a seccomp filter that makes `close_range` fail with ENOSYS, as
    /// on kernels before 5.11 and under older container profiles.
    NoCloseRange,
}

pub(crate) const COVER_CGROUP: &str =
    "mount -t tmpfs -o ro,mode=755 sandmux-test-nocgroup /sys/fs/cgroup && exec \"$0\" \"$@\"";
pub(crate) const NO_NESTED_USERNS: &str =
    "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"";

/// A filter returning ENOSYS for `landlock_create_ruleset`, `landlock_add_rule`
/// and `landlock_restrict_self`, allowing everything else.
pub(crate) fn landlock_enosys_filter() -> seccompiler::BpfProgram {
    errno_filter(
        &[
            libc::SYS_landlock_create_ruleset,
            libc::SYS_landlock_add_rule,
            libc::SYS_landlock_restrict_self,
        ],
        libc::ENOSYS,
    )
}

/// A filter failing `syscalls` with `errno`, allowing everything else.
pub(crate) fn errno_filter(syscalls: &[i64], errno: i32) -> seccompiler::BpfProgram {
    use seccompiler::{SeccompAction, SeccompFilter};
    let rules = syscalls.iter().map(|n| (*n, vec![])).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        std::env::consts::ARCH.try_into().expect("seccompiler arch"),
    )
    .expect("filter");
    filter.try_into().expect("compile filter")
}

/// A filter that refuses to install further seccomp filters: `seccomp(2)` and
/// `prctl(PR_SET_SECCOMP, ...)` fail with EINVAL, as on a kernel built without
/// `CONFIG_SECCOMP_FILTER`.
pub(crate) fn no_seccomp_filter() -> seccompiler::BpfProgram {
    use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition};
    use seccompiler::{SeccompFilter, SeccompRule};
    let set_seccomp = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::PR_SET_SECCOMP as u64,
    )
    .expect("condition");
    let rules = [
        (libc::SYS_seccomp, vec![]),
        (
            libc::SYS_prctl,
            vec![SeccompRule::new(vec![set_seccomp]).expect("rule")],
        ),
    ]
    .into_iter()
    .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EINVAL as u32),
        std::env::consts::ARCH.try_into().expect("seccompiler arch"),
    )
    .expect("filter");
    filter.try_into().expect("compile filter")
}

/// Sets no_new_privs and installs `prog` on the calling thread.
pub(crate) fn install(prog: &seccompiler::BpfProgram) -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    seccompiler::apply_filter(prog).map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the ABI, or -errno.
pub(crate) fn landlock_abi_here() -> i64 {
    // SAFETY: with a NULL attr and the VERSION flag the call only returns an integer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if r < 0 {
        -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64)
    } else {
        r
    }
}

/// `program args...` started in `env`. `tmp` is a private TMPDIR for the
/// wrapped environments (inside a user namespace the caller shows up as uid 0,
/// whose usual runtime base /tmp/sandmux-0 may belong to the real root).
pub(crate) fn wrap(env: Env, tmp: &Path, program: &OsStr, args: &[&str]) -> Command {
    let root = uid() == 0;
    let mut c = match env {
        Env::Plain | Env::NoLandlock | Env::NoSeccomp | Env::NoKeyring | Env::NoCloseRange => {
            Command::new(program)
        }
        Env::NoUserns => {
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-root-user", "sh", "-c", NO_NESTED_USERNS]);
            c.arg(program);
            c
        }
        Env::NoCgroupMount => {
            let mut c = Command::new("unshare");
            if !root {
                c.args(["--user", "--map-root-user"]);
            }
            c.args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                COVER_CGROUP,
            ]);
            c.arg(program);
            c
        }
    };
    // `serve` refuses every SANDMUX_* variable it does not read; the harness's
    // own SANDMUX_BIN (set for the runs as uid 65534) is one.
    c.args(args).stdin(Stdio::null()).env_remove("SANDMUX_BIN");
    if matches!(env, Env::NoUserns | Env::NoCgroupMount) {
        c.env("TMPDIR", tmp).env_remove("XDG_RUNTIME_DIR");
    }
    let filter = match env {
        Env::NoLandlock => Some(landlock_enosys_filter()),
        Env::NoSeccomp => Some(no_seccomp_filter()),
        Env::NoKeyring => Some(errno_filter(&[libc::SYS_keyctl], libc::EPERM)),
        Env::NoCloseRange => Some(errno_filter(&[libc::SYS_close_range], libc::ENOSYS)),
        _ => None,
    };
    if let Some(prog) = filter {
        // SAFETY: between fork and exec only prctl and seccomp(2) run, on a
        // program compiled before the fork.
        unsafe {
            c.pre_exec(move || install(&prog));
        }
    }
    c
}

/// sandmux with `args`, started in `env`.
pub(crate) fn sandmux_in(env: Env, tmp: &Path, args: &[&str]) -> Output {
    wrap(env, tmp, bin().as_os_str(), args)
        .output()
        .expect("spawn sandmux")
}

/// A `sandmux run` ([`run`]) in `env`.
pub(crate) fn run_in(env: Env, tmp: &Path, r: Run) -> Output {
    let args = r.args();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
    sandmux_in(env, tmp, &args)
}

/// `sandmux check --json -p PROFILE -w WS` in `env`: exit status and report.
pub(crate) fn check_json(env: Env, tmp: &Path, profile: &str, ws: &Ws) -> (Option<i32>, Value) {
    let o = sandmux_in(
        env,
        tmp,
        &[
            "check",
            "--json",
            "-p",
            profile,
            "-w",
            ws.path().to_str().unwrap(),
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("check --json in {env:?}: {e}: {}", text(&o)));
    (o.status.code(), v)
}

/// The layers the report lists as not enforced.
pub(crate) fn dropped(v: &Value) -> BTreeSet<String> {
    v["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .filter(|l| l["enforced"] == false)
        .map(|l| l["layer"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn observation<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["observations"]
        .as_array()
        .expect("observations")
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no observation {name}: {v:#}"))
}

/// Exit 3, "required layer 'L' is unavailable", and exactly one `fix:` line:
/// the layer's fix.
pub(crate) fn assert_refused(what: &str, o: &Output, layer: Layer) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(3), "{what}: {t}");
    let named = format!("required layer '{}' is unavailable", layer.name());
    assert!(t.contains(&named), "{what}: does not name {layer}: {t}");
    let fixes: Vec<&str> = t
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("fix:"))
        .collect();
    assert_eq!(
        fixes,
        vec![format!("fix: {}", layer.fix()).as_str()],
        "{what}: {t}"
    );
}

/// `profile show BASE`, edited: `[enforcement] best_effort` replaced by
/// `best_effort`, and `landlock_abi = N` added when given.
pub(crate) fn profile_with(
    dir: &Path,
    name: &str,
    base: &str,
    best_effort: &[&str],
    landlock_abi: Option<u8>,
) -> PathBuf {
    profile_file(dir, name, base, |t| {
        assert!(t.contains("\n[enforcement]\n") && t.contains("\nbest_effort = "));
        let list: Vec<String> = best_effort.iter().map(|l| format!("{l:?}")).collect();
        t.lines()
            .map(|l| {
                if l.starts_with("best_effort = ") {
                    format!("best_effort = [{}]", list.join(", "))
                } else if l == "[enforcement]" {
                    match landlock_abi {
                        Some(n) => format!("[enforcement]\nlandlock_abi = {n}"),
                        None => l.to_string(),
                    }
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    })
}

/// One degraded environment.
pub(crate) struct Case<'a> {
    /// Where sandmux runs.
    pub(crate) env: Env,
    /// The layer the refusal must name.
    pub(crate) layer: Layer,
    /// A profile (built-in name or file) that requires the layer.
    pub(crate) required: &'a str,
    /// The profile with the explicit opt-in.
    pub(crate) opt_in: &'a Path,
    /// The same profile for the non-degraded environment (for the ABI case:
    /// without the pin); its report there is the baseline.
    pub(crate) baseline: &'a Path,
    /// Layers this environment drops on top of the baseline.
    pub(crate) degraded: &'a [&'a str],
}

/// The assertions every case shares. Returns (baseline report, degraded report).
pub(crate) fn assert_case(c: &Case<'_>, ws: &Ws, tmp: &Path) -> (Value, Value) {
    assert_refuses(c, ws, tmp);
    assert_opt_in_runs(c, ws, tmp);
    assert_opt_in_reports(c, ws, tmp)
}

/// `run -p PROFILE -- touch ran` refuses naming `layer`, and `ran` never appears.
pub(crate) fn assert_run_refused(
    env: Env,
    tmp: &Path,
    profile: &str,
    ws: &Ws,
    what: &str,
    layer: Layer,
) {
    let o = run_in(
        env,
        tmp,
        run(ws.path()).profile(profile).cmd(["touch", "ran"]),
    );
    assert_refused(what, &o, layer);
    assert!(
        !ws.join("ran").exists(),
        "{what}: the command ran without a required layer"
    );
}

/// The required layer refuses start-up of `run` and of a tmux instance.
pub(crate) fn assert_refuses(c: &Case<'_>, ws: &Ws, tmp: &Path) {
    let env = c.env;

    // The required layer refuses start-up, before anything runs.
    let what = format!("run -p {} in {env:?}", c.required);
    assert_run_refused(env, tmp, c.required, ws, &what, c.layer);
    // The same for a tmux instance (what `serve` and `shell` start).
    let (code, v) = check_json(env, tmp, c.required, ws);
    assert_eq!(code, Some(3), "check -p {} in {env:?}: {v:#}", c.required);
    assert_eq!(v["enforceable"], false, "{v:#}");
    let err = v["error"].as_str().expect("error");
    assert!(
        err.contains(&format!("required layer '{}'", c.layer.name()))
            && err.contains(&format!("fix: {}", c.layer.fix())),
        "{err}"
    );
    // What the sandbox reported before it stopped: the refusing layer not in force.
    let refused = v["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .find(|l| l["layer"] == c.layer.name());
    assert_eq!(
        refused.map(|l| &l["enforced"]),
        Some(&Value::Bool(false)),
        "{v:#}"
    );
}

/// The explicit opt-in starts: `run -- true` exits 0.
pub(crate) fn assert_opt_in_runs(c: &Case<'_>, ws: &Ws, tmp: &Path) {
    let o = run_in(c.env, tmp, run(ws.path()).profile(c.opt_in).cmd(["true"]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "opt-in run in {:?}: {}",
        c.env,
        text(&o)
    );
}

/// With the opt-in a tmux instance starts too, and `check --json` lists exactly
/// the baseline's dropped layers plus this environment's.
pub(crate) fn assert_opt_in_reports(c: &Case<'_>, ws: &Ws, tmp: &Path) -> (Value, Value) {
    let env = c.env;
    let opt = c.opt_in.to_str().unwrap();

    // Baseline: what this machine and uid drop anyway, in the plain environment.
    let (_, base) = check_json(Env::Plain, tmp, c.baseline.to_str().unwrap(), ws);
    assert_eq!(base["enforceable"], true, "baseline: {base:#}");
    assert!(base["error"].is_null(), "baseline: {base:#}");
    let base_dropped = dropped(&base);
    for l in c.degraded {
        assert!(
            !base_dropped.contains(*l),
            "{l} is already missing in the plain environment: {base:#}"
        );
    }

    // Degraded: exactly the baseline's drops plus this environment's.
    let (code, v) = check_json(env, tmp, opt, ws);
    assert_eq!(v["enforceable"], true, "opt-in check in {env:?}: {v:#}");
    assert!(
        v["error"].is_null(),
        "the live probe did not report in {env:?}: {v:#}"
    );
    assert!(!v["observations"].as_array().unwrap().is_empty(), "{v:#}");
    // 0 if every probe still matched the profile, 1 if one shows the gap.
    assert!(matches!(code, Some(0) | Some(1)), "{code:?}: {v:#}");
    let mut expected = base_dropped;
    expected.extend(c.degraded.iter().map(|s| s.to_string()));
    assert_eq!(dropped(&v), expected, "{env:?}: {v:#}");
    (base, v)
}

pub(crate) fn scratch() -> (Ws, tempfile::TempDir, tempfile::TempDir) {
    (Ws::new(), host_dir(), host_dir())
}

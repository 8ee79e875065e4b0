//! E32 (silent degradation): each degraded environment is built for real — a
//! seccomp filter that takes Landlock away, a user namespace that allows no
//! nested user namespaces, a mount namespace without a writable cgroup, a
//! profile pinning an old Landlock ABI, a seccomp filter that forbids further
//! filters — never by faking a probe or a variable sandmux reads. In each, a
//! profile that requires the layer refuses to start (exit 3, the layer named,
//! one `fix:` line) and runs nothing; the explicit opt-in starts, and
//! `check --json` lists exactly the dropped layers, as reported by the sandbox
//! while it started, plus a live probe from inside that shows the missing layer.
//!
//! Every case runs both as root and as an unprivileged uid (CI re-runs this
//! binary as 65534).

mod common;
use common::*;
use sandmux::testing::Layer;
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where sandmux (or a control program) is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Env {
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

const COVER_CGROUP: &str =
    "mount -t tmpfs -o ro,mode=755 sandmux-test-nocgroup /sys/fs/cgroup && exec \"$0\" \"$@\"";
const NO_NESTED_USERNS: &str = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"";

/// A filter returning ENOSYS for `landlock_create_ruleset`, `landlock_add_rule`
/// and `landlock_restrict_self`, allowing everything else.
fn landlock_enosys_filter() -> seccompiler::BpfProgram {
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
fn errno_filter(syscalls: &[i64], errno: i32) -> seccompiler::BpfProgram {
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
fn no_seccomp_filter() -> seccompiler::BpfProgram {
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
fn install(prog: &seccompiler::BpfProgram) -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    seccompiler::apply_filter(prog).map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the ABI, or -errno.
fn landlock_abi_here() -> i64 {
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
fn wrap(env: Env, tmp: &Path, program: &OsStr, args: &[&str]) -> Command {
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
fn sandmux_in(env: Env, tmp: &Path, args: &[&str]) -> Output {
    wrap(env, tmp, bin().as_os_str(), args)
        .output()
        .expect("spawn sandmux")
}

/// A `sandmux run` ([`run`]) in `env`.
fn run_in(env: Env, tmp: &Path, r: Run) -> Output {
    let args = r.args();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
    sandmux_in(env, tmp, &args)
}

/// `sandmux check --json -p PROFILE -w WS` in `env`: exit status and report.
fn check_json(env: Env, tmp: &Path, profile: &str, ws: &Ws) -> (Option<i32>, Value) {
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
fn dropped(v: &Value) -> BTreeSet<String> {
    v["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .filter(|l| l["enforced"] == false)
        .map(|l| l["layer"].as_str().unwrap().to_string())
        .collect()
}

fn observation<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["observations"]
        .as_array()
        .expect("observations")
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no observation {name}: {v:#}"))
}

/// Exit 3, "required layer 'L' is unavailable", and exactly one `fix:` line:
/// the layer's fix.
fn assert_refused(what: &str, o: &Output, layer: Layer) {
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
fn profile_with(
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
struct Case<'a> {
    /// Where sandmux runs.
    env: Env,
    /// The layer the refusal must name.
    layer: Layer,
    /// A profile (built-in name or file) that requires the layer.
    required: &'a str,
    /// The profile with the explicit opt-in.
    opt_in: &'a Path,
    /// The same profile for the non-degraded environment (for the ABI case:
    /// without the pin); its report there is the baseline.
    baseline: &'a Path,
    /// Layers this environment drops on top of the baseline.
    degraded: &'a [&'a str],
}

/// The assertions every case shares. Returns (baseline report, degraded report).
fn assert_case(c: &Case<'_>, ws: &Ws, tmp: &Path) -> (Value, Value) {
    assert_refuses(c, ws, tmp);
    assert_opt_in_runs(c, ws, tmp);
    assert_opt_in_reports(c, ws, tmp)
}

/// `run -p PROFILE -- touch ran` refuses naming `layer`, and `ran` never appears.
fn assert_run_refused(env: Env, tmp: &Path, profile: &str, ws: &Ws, what: &str, layer: Layer) {
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
fn assert_refuses(c: &Case<'_>, ws: &Ws, tmp: &Path) {
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
fn assert_opt_in_runs(c: &Case<'_>, ws: &Ws, tmp: &Path) {
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
fn assert_opt_in_reports(c: &Case<'_>, ws: &Ws, tmp: &Path) -> (Value, Value) {
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

fn scratch() -> (Ws, tempfile::TempDir, tempfile::TempDir) {
    (Ws::new(), host_dir(), host_dir())
}

/// No Landlock: the kernel answers ENOSYS to every Landlock syscall.
#[test]
fn no_landlock_fails_closed_and_the_opt_in_reports_it() {
    // Positive control, on a thread of our own (seccomp and no_new_privs are
    // per thread): the filter really takes Landlock away.
    let before = landlock_abi_here();
    assert!(
        before > 0,
        "this kernel has no Landlock to take away: {before}"
    );
    let after = std::thread::spawn(|| {
        install(&landlock_enosys_filter()).expect("install filter");
        landlock_abi_here()
    })
    .join()
    .unwrap();
    assert_eq!(after, -(libc::ENOSYS as i64));

    let (ws, dir, tmp) = scratch();
    let be = |extra: &[&'static str]| {
        let mut v = vec!["cgroup"];
        v.extend_from_slice(extra);
        v
    };
    let opt = profile_with(
        dir.path(),
        "nolandlock",
        "default",
        &be(&["landlock", "landlock-scope", "supervisor"]),
        None,
    );
    let (base, v) = assert_case(
        &Case {
            env: Env::NoLandlock,
            layer: Layer::Landlock,
            required: "default",
            opt_in: &opt,
            baseline: &opt,
            degraded: &["landlock", "landlock-scope", "supervisor"],
        },
        &ws,
        tmp.path(),
    );
    assert!(base["kernel"]["landlock_abi"].as_u64().unwrap() > 0);
    assert_eq!(v["kernel"]["landlock_abi"], 0, "{v:#}");
    // Observed from inside: without Landlock a pane can signal the tmux server.
    let reach = observation(&v, "tmux_server_reach");
    assert!(
        reach["observed"]
            .as_str()
            .unwrap()
            .contains("SIGNAL DELIVERED"),
        "{reach}"
    );
    assert_eq!(reach["passed"], false, "{reach}");

    // The sandbox may go without Landlock, `serve` itself may not: the
    // supervisor's own confinement is a layer of its own, refused by name.
    let sup = profile_with(
        dir.path(),
        "nosup",
        "default",
        &be(&["landlock", "landlock-scope"]),
        None,
    );
    let log = tmp.path().join("nosup.jsonl");
    let wsp = ws.path().to_path_buf();
    let args = [
        "serve",
        "-p",
        sup.to_str().unwrap(),
        "-w",
        wsp.to_str().unwrap(),
        "--audit-log",
        log.to_str().unwrap(),
    ];
    let mut cmd = wrap(Env::NoLandlock, tmp.path(), bin().as_os_str(), &args);
    // `serve` refuses SANDMUX_* variables it does not know (E30).
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SANDMUX_") {
            cmd.env_remove(k);
        }
    }
    let o = cmd.output().expect("spawn sandmux");
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("required layer 'supervisor' is unavailable: Landlock")
            && err.contains("\"supervisor\" to [enforcement] best_effort"),
        "{}",
        text(&o)
    );

    // Dropping "landlock" alone is not enough: its scopes are a layer of their own.
    let half = profile_with(dir.path(), "half", "default", &be(&["landlock"]), None);
    let half = half.to_str().unwrap();
    assert_run_refused(
        Env::NoLandlock,
        tmp.path(),
        half,
        &ws,
        "landlock without landlock-scope",
        Layer::LandlockScope,
    );
}

/// No user namespaces: a user namespace whose max_user_namespaces is 0.
#[test]
fn no_userns_fails_closed_and_the_opt_in_reports_it() {
    let (ws, dir, tmp) = scratch();
    // Positive control: a user namespace can be made here, and inside the
    // built environment a nested one cannot.
    let unshare_u = |env| {
        wrap(env, tmp.path(), OsStr::new("unshare"), &["-U", "true"])
            .output()
            .expect("unshare")
    };
    let o = unshare_u(Env::Plain);
    assert!(o.status.success(), "unshare -U true: {}", text(&o));
    let o = unshare_u(Env::NoUserns);
    assert!(!o.status.success(), "nested userns allowed: {}", text(&o));
    assert!(text(&o).contains("No space left on device"), "{}", text(&o));

    let opt = profile_with(
        dir.path(),
        "nouserns",
        "default",
        &["cgroup", "userns"],
        None,
    );
    let (base, v) = assert_case(
        &Case {
            env: Env::NoUserns,
            layer: Layer::Userns,
            required: "default",
            opt_in: &opt,
            baseline: &opt,
            degraded: &["userns"],
        },
        &ws,
        tmp.path(),
    );
    assert!(base["kernel"]["userns"]["Ok"].is_null(), "{base:#}");
    assert!(v["kernel"]["userns"]["Err"].is_string(), "{v:#}");
    // Observed from inside: no id mapping, so the pane keeps the caller's uid
    // (0 in the surrounding namespace) instead of the sandbox uid.
    let id = observation(&v, "identity");
    assert!(
        id["observed"].as_str().unwrap().starts_with("uid 0,"),
        "{id}"
    );
    assert_eq!(id["passed"], false, "{id}");
    assert_eq!(observation(&base, "identity")["passed"], true);
}

/// The same probe for writable cgroups sandmux would use: in every cgroup
/// hierarchy, a directory under each of this process's cgroup paths. Prints
/// each directory it could create (and removes it).
const CGROUP_PROBE: &str = r#"for m in $(awk '/ - cgroup2? /{print $5}' /proc/self/mountinfo); do
  for p in $(cut -d: -f3 /proc/self/cgroup | sort -u); do
    d="$m$p/sandmux-degraded-probe-$$"
    if mkdir "$d" 2>/dev/null; then rmdir "$d"; echo "writable: $d"; fi
  done
done"#;

fn writable_cgroups(env: Env, tmp: &Path) -> String {
    let o = wrap(env, tmp, OsStr::new("sh"), &["-c", CGROUP_PROBE])
        .output()
        .expect("sh");
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// No writable cgroup, for a profile that requires the cgroup layer.
/// `/proc/self/cgroup` as a command run by `profile` in `env` sees it.
fn cgroup_inside(env: Env, tmp: &Path, profile: &Path, ws: &Ws) -> Output {
    let r = run(ws.path()).profile(profile);
    run_in(env, tmp, r.cmd(["cat", "/proc/self/cgroup"]))
}

#[test]
fn no_cgroup_fails_closed_and_the_opt_in_reports_it() {
    let (ws, dir, tmp) = scratch();
    let required = profile_with(dir.path(), "cgreq", "default", &[], None);
    let opt = profile_with(dir.path(), "cgopt", "default", &["cgroup"], None);
    let mut envs = vec![Env::NoCgroupMount];
    let plain = writable_cgroups(Env::Plain, tmp.path());
    if uid() == 0 {
        // Positive control: root can create a cgroup here, and the sandbox joins it.
        assert!(!plain.is_empty(), "no writable cgroup even for root");
        let o = cgroup_inside(Env::Plain, tmp.path(), &required, &ws);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("/sandmux-"),
            "{}",
            text(&o)
        );
    } else if plain.is_empty() {
        // An unprivileged uid has no writable cgroup on this machine: the plain
        // environment is a degraded one too.
        envs.insert(0, Env::Plain);
    } else {
        eprintln!("uid {} has a writable cgroup here ({plain}); only the covered-cgroup environment is tested", uid());
    }
    let covered = writable_cgroups(Env::NoCgroupMount, tmp.path());
    assert!(covered.is_empty(), "still writable: {covered}");

    for env in envs {
        let (_, v) = assert_case(
            &Case {
                env,
                layer: Layer::Cgroup,
                required: required.to_str().unwrap(),
                opt_in: &opt,
                baseline: &opt,
                // As an unprivileged uid the baseline has no cgroup either.
                degraded: if uid() == 0 { &["cgroup"] } else { &[] },
            },
            &ws,
            tmp.path(),
        );
        assert!(v["kernel"]["cgroup"]["Err"].is_string(), "{env:?}: {v:#}");
        assert!(dropped(&v).contains("cgroup"), "{env:?}: {v:#}");
        // Observed from inside: the command is in no cgroup of sandmux's.
        let o = cgroup_inside(env, tmp.path(), &opt, &ws);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("/sandmux-"),
            "{env:?}: {}",
            text(&o)
        );
    }
}

/// A profile pinning Landlock ABI 3 in network mode "host": TCP port rules
/// (ABI 4) and scopes (ABI 6) are missing. (`cli.rs` covers ABI 5 and scopes
/// with the default profile.)
#[test]
fn old_landlock_abi_fails_closed_and_the_opt_in_reports_it() {
    let (ws, dir, tmp) = scratch();
    let required = profile_with(dir.path(), "abi3", "dev", &["cgroup"], Some(3));
    let opt = profile_with(
        dir.path(),
        "abi3opt",
        "dev",
        &["cgroup", "landlock-net", "landlock-scope"],
        Some(3),
    );
    let unpinned = profile_with(
        dir.path(),
        "unpinned",
        "dev",
        &["cgroup", "landlock-net", "landlock-scope"],
        None,
    );
    let (base, v) = assert_case(
        &Case {
            env: Env::Plain,
            layer: Layer::LandlockNet,
            required: required.to_str().unwrap(),
            opt_in: &opt,
            baseline: &unpinned,
            degraded: &["landlock-net", "landlock-scope"],
        },
        &ws,
        tmp.path(),
    );
    let landlock = |v: &Value| {
        v["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == "landlock")
            .map(|l| l["detail"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert!(landlock(&v).starts_with("ABI 3 "), "{v:#}");
    // Observed from inside: without TCP rules, a connect to a port not on the
    // list reaches the network stack (refused there, not by Landlock).
    let seen = |v: &Value| {
        observation(v, "tcp_connect")["observed"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(seen(&base).contains("EACCES"), "{base:#}");
    assert!(
        !seen(&v).contains("EACCES") && !seen(&v).contains("EPERM"),
        "{v:#}"
    );

    // Each missing sub-layer needs its own opt-in.
    let half = profile_with(
        dir.path(),
        "abi3half",
        "dev",
        &["cgroup", "landlock-net"],
        Some(3),
    );
    let half = half.to_str().unwrap();
    assert_run_refused(
        Env::Plain,
        tmp.path(),
        half,
        &ws,
        "ABI 3 without landlock-scope",
        Layer::LandlockScope,
    );
}

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
    let opt = profile_with(
        dir.path(),
        "noseccomp",
        "default",
        &["cgroup", "seccomp", "supervisor"],
        None,
    );
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
    let opt = profile_with(
        dir.path(),
        "noseccomp",
        "default",
        &["cgroup", "seccomp", "supervisor"],
        None,
    );
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

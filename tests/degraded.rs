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
//!
//! This file: the kernel's layers (Landlock, user namespaces, cgroups, an old
//! Landlock ABI); `degraded_calls.rs`: the calls a container's seccomp
//! profile refuses (seccomp itself, `keyctl`, `close_range`).

use crate::common;
use crate::degraded_env;
use common::*;
use degraded_env::*;
use sandmux::testing::Layer;
use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Output;

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

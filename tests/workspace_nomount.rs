//! P8 where the kernel cannot make control files read-only: the `container`
//! profile started where `unshare(2)` is refused (as under a container
//! runtime's default seccomp profile), so there is no mount namespace. The
//! supervisor's snapshot-and-restore must then revert what the agent changes
//! in `.git` and in guarded tool configuration; host git and direnv run
//! afterwards. Positive control: the same attack with the guard off.

use crate::common;
use common::*;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

/// A filter that makes `unshare(2)` fail with EPERM, allowing everything else.
fn no_unshare() -> seccompiler::BpfProgram {
    use seccompiler::{SeccompAction, SeccompFilter};
    let filter = SeccompFilter::new(
        [(libc::SYS_unshare, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        std::env::consts::ARCH.try_into().expect("seccompiler arch"),
    )
    .expect("filter");
    filter.try_into().expect("compile filter")
}

fn run_without_namespaces(ws: &Path, profile: &str, state: &Path, script: &str) -> Output {
    without_namespaces(run_cmd(ws, profile, state, script))
}

fn without_namespaces(mut c: Command) -> Output {
    let prog = no_unshare();
    // SAFETY: between fork and exec only prctl and seccomp(2) run, on a
    // program compiled before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            seccompiler::apply_filter(&prog)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
        });
    }
    c.output().expect("spawn sandmux")
}

fn git(dir: &Path, args: &[&str]) -> Output {
    host_git(dir, args)
}

#[test]
fn without_a_mount_namespace_changes_are_restored() {
    let cfg = host_dir();
    let open = profile_file(cfg.path(), "open", "container", unguard);
    for profile in ["container", open.to_str().unwrap()] {
        let guarded = profile == "container";
        let ws = Ws::new();
        let w = ws.path();
        for a in [
            &["init", "-q", "-b", "main"][..],
            &["commit", "-q", "--allow-empty", "-m", "first"],
        ] {
            assert!(git(&w, a).status.success());
        }
        put(&w.join(".envrc"), "export A=1\n");
        // As root without a user namespace sandmux drops to the workspace's
        // owner: make that an unprivileged uid, as a user's volume is.
        if nix::unistd::geteuid().is_root() {
            let o = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&w)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", text(&o));
        }
        let config = std::fs::read(w.join(".git/config")).unwrap();
        let host = host_dir();
        let marker = host.path().join("MARKER");
        let script = format!(
            r#"P="touch {m}"
printf '[core]\n\tfsmonitor = %s\n' "$P" >> .git/config && echo wrote-config
printf '#!/bin/sh\n%s\n' "$P" > .git/hooks/post-commit && chmod +x .git/hooks/post-commit
echo "$P" >> .envrc
sleep 0.3
echo attacks-done"#,
            m = marker.display()
        );
        let o = run_without_namespaces(&w, profile, host.path(), &script);
        let t = text(&o);
        assert!(t.contains("attacks-done"), "{profile}: {t}");
        // The premise: no mount namespace, so the writes themselves succeeded.
        assert!(
            t.contains("wrote-config"),
            "{profile}: the mount layer held; this test proves nothing\n{t}"
        );
        let _ = git(&w, &["status"]);
        let _ = git(&w, &["commit", "-q", "--allow-empty", "-m", "host"]);
        if guarded {
            assert!(!marker.exists(), "agent code ran on the host\n{t}");
            assert_eq!(std::fs::read(w.join(".git/config")).unwrap(), config, "{t}");
            assert!(!w.join(".git/hooks/post-commit").exists(), "{t}");
            assert_eq!(
                std::fs::read_to_string(w.join(".envrc")).unwrap(),
                "export A=1\n",
                "{t}"
            );
            assert!(t.contains("original restored"), "{t}");
        } else {
            assert!(
                marker.exists(),
                "positive control: unguarded, host git obeys the agent\n{t}"
            );
        }
    }
}

/// The built-ins' copy-on-write workspace where no mount namespace can be
/// had: the `container` profile, which lets the mount layer go, works on a
/// private copy (never live unless asked) and says so; the host's tree
/// does not change, by the workspace's path either (Landlock), and the
/// door brings the work in. `default`, which needs the mount layer,
/// refuses to start and names the missing layer. Controls: asked for
/// live, the same write by the host's path lands; where namespaces work,
/// the same container run is copy-on-write.
#[test]
fn copy_on_write_falls_back_to_a_copy_only_where_the_profile_lets_the_mount_layer_go() {
    let ws = Ws::new();
    let script = "echo work > notes.txt && (echo x > {ws}/by-path || true) && echo done";
    let script = &script.replace("{ws}", &ws.path().display().to_string());
    let host = host_dir();
    if nix::unistd::geteuid().is_root() {
        let o = Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(ws.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = without_namespaces(run_cow_cmd(&ws.path(), "container", host.path(), script));
    let t = text(&o);
    assert!(t.contains("done"), "{t}");
    assert!(t.contains("a private copy, not copy-on-write"), "{t}");
    assert!(!t.contains("live workspace"), "{t}");
    assert!(
        !ws.join("notes.txt").exists(),
        "the host's tree changed\n{t}"
    );
    assert!(
        !ws.join("by-path").exists(),
        "the agent wrote the host's tree by its path\n{t}"
    );
    let id = t
        .split("sandmux diff ")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .expect("the kept layer's id")
        .to_string();
    let door = |args: &[&str]| {
        sandmux(args)
            .env("XDG_STATE_HOME", host.path())
            .output()
            .unwrap()
    };
    let d = door(&["diff", &id, "--names-only"]);
    assert!(text(&d).contains("A notes.txt"), "{}", text(&d));
    let a = door(&["apply", &id]);
    assert!(a.status.success(), "{}", text(&a));
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "work\n"
    );
    assert!(door(&["discard", &id]).status.success());
    // Control: asked for live, the write by the host's path lands.
    let o = without_namespaces(
        run(ws.path())
            .live()
            .profile("container")
            .state(host.path())
            .script(&format!("echo x > {}/by-path", ws.path().display()))
            .command(),
    );
    assert!(
        ws.join("by-path").exists(),
        "positive control\n{}",
        text(&o)
    );
    let ws = Ws::new();
    let o = without_namespaces(run_cow_cmd(&ws.path(), "default", host.path(), "echo done"));
    let t = text(&o);
    assert!(!t.contains("done") && !o.status.success(), "{t}");
    // The first required layer missing here is the user namespace, which
    // the mount layer needs.
    assert!(t.contains("required layer 'userns' is unavailable"), "{t}");
    assert!(!ws.join("notes.txt").exists());
    // Control: with namespaces, the same container run keeps the host's
    // tree as it was (the layer is kept: --on-end keep).
    let ws = Ws::new();
    let o = run_cow_cmd(
        &ws.path(),
        "container",
        host.path(),
        "echo work > notes.txt && echo done",
    )
    .output()
    .unwrap();
    let t = text(&o);
    assert!(
        t.contains("done") && !t.contains("not copy-on-write"),
        "{t}"
    );
    assert!(!ws.join("notes.txt").exists(), "{t}");
    assert!(t.contains("sandmux apply"), "{t}");
}

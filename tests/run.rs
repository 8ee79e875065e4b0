//! `sandmux run`: one confined command, stdio passed through, status returned.

use crate::common;
use common::*;
use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn exit_status_and_stdio_pass_through() {
    let ws = Ws::new();
    let o = run_script(&ws, "default", "echo out; echo err >&2; exit 7");
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out\n");
    assert!(String::from_utf8_lossy(&o.stderr).contains("err"));

    let mut child = run(ws.path())
        .cmd(["tr", "a-z", "A-Z"])
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello sandbox\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "HELLO SANDBOX\n");
}

#[test]
fn command_not_found_is_127_and_signal_is_128_plus() {
    let ws = Ws::new();
    run(ws.path())
        .cmd(["no-such-command-xyz"])
        .output()
        .code(127)
        .says("no-such-command-xyz");
    let o = run_script(&ws, "default", "kill -TERM $$");
    assert_eq!(o.status.code(), Some(128 + 15), "{}", text(&o));
}

#[test]
fn workspace_is_writable_and_the_cwd() {
    let ws = Ws::new();
    let o = run_script(&ws, "default", "pwd; echo data > made-inside");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        ws.path().to_str().unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("made-inside")).unwrap(),
        "data\n"
    );
}

/// P1 as seen from inside: unprivileged uid, no capabilities in any set,
/// no_new_privs, the seccomp filter, its own pid view and hostname.
#[test]
fn process_state_inside() {
    let ws = Ws::new();
    let o = run_script(&ws, "default", "id -u; hostname; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; ls /proc | grep -c '^[0-9]'");
    assert!(o.status.success(), "{}", text(&o));
    // stdout only: stderr may hold the `sandmux:` line naming dropped layers.
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], "1000", "{t}");
    assert_eq!(lines[1], "sandmux", "{t}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            t.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {t}"
        );
    }
    assert!(t.contains("NoNewPrivs:\t1"), "{t}");
    assert!(
        t.contains("Seccomp:\t2") && t.contains("Seccomp_filters:\t3"),
        "{t}"
    );
    let nprocs: usize = lines.last().unwrap().trim().parse().unwrap();
    assert!(nprocs < 10, "host processes visible: {nprocs}");
}

/// E31: canary secrets in sandmux's own environment never reach the inside;
/// the environment equals the profile's keep + set entries.
#[test]
fn environment_is_the_allowlist() {
    let ws = Ws::new();
    let o = run(ws.path())
        .cmd(["env"])
        .command()
        .env("AWS_SECRET_ACCESS_KEY", "canary-aws-1234")
        .env("SSH_AUTH_SOCK", "/tmp/ssh-canary/agent")
        .env("TMUX", "/tmp/tmux-0/default,1234,0")
        .env("TMUX_PANE", "%9")
        .env("LD_PRELOAD", "/tmp/evil.so")
        .env("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/0/bus")
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // stdout only: the host's loader complains about LD_PRELOAD on stderr, for
    // sandmux's own process (the caller's environment applies to the caller).
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    for bad in [
        "canary-aws-1234",
        "ssh-canary",
        "TMUX",
        "LD_PRELOAD",
        "DBUS_SESSION",
    ] {
        assert!(!t.contains(bad), "{bad} leaked: {t}");
    }
    let names: Vec<&str> = t
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    let allowed = [
        "PATH",
        "TERM",
        "LANG",
        "LANGUAGE",
        "TZ",
        "COLORTERM",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "HISTCONTROL",
    ];
    for n in &names {
        assert!(
            allowed.contains(n) || n.starts_with("LC_"),
            "unexpected variable {n}: {t}"
        );
    }
    assert!(
        t.contains("LANG=C.UTF-8") && t.contains("HOME=/home/sandmux"),
        "{t}"
    );
    assert!(
        t.contains("PATH=/usr/local/bin:/usr/bin:/bin:"),
        "PATH is the profile's, not the caller's: {t}"
    );
}

/// The sandbox leaves nothing behind: no process, no runtime directory.
#[test]
fn nothing_left_after_run() {
    let ws = Ws::new();
    let child = run(ws.path())
        .script("(sleep 31.7 &) ; setsid sleep 31.7 & echo started")
        .command()
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sup = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    // The backgrounded sleeps died with the sandbox's pid namespace.
    let survivors: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .map(|c| c == "sleep\x0031.7\x00")
                .unwrap_or(false)
        })
        .filter(|p| alive(*p))
        .collect();
    assert!(
        survivors.is_empty(),
        "processes outlived the sandbox: {survivors:?}"
    );
    assert_no_rundir_of(sup);
}

/// Without host network, the names files inside say why names do not
/// resolve (issue 10); `host` mode keeps the host's own.
#[test]
fn name_files_explain_the_network_policy() {
    let ws = Ws::new();
    for (profile, want) in [
        ("default", "mode = \"none\""),
        ("ci", "mode = \"loopback\""),
    ] {
        let o = run_script(&ws, profile, "cat /etc/resolv.conf /etc/hosts; getent hosts localhost >/dev/null && echo localhost-ok");
        let t = text(&o);
        assert!(
            t.contains("no DNS here") && t.contains(want),
            "{profile}: {t}"
        );
        assert!(t.contains("localhost-ok"), "{profile}: {t}");
    }
    let o = run_script(&ws, "dev", "cat /etc/resolv.conf 2>&1; true");
    assert!(!text(&o).contains("sandmux: no DNS"), "{}", text(&o));
}

/// Network mode `proxy` under `run` (the built-in `registries`): the proxy
/// variables in every spelling, name files that say names resolve through
/// the proxy, a refusal answered by the proxy the outer process serves, and
/// its decisions summed up on stderr at the end.
#[test]
fn proxy_mode_run_serves_the_proxy_and_sums_up_its_decisions() {
    let ws = Ws::new();
    let o = run_script(
        &ws,
        "registries",
        "for v in http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY; do printenv $v >/dev/null && echo have-$v; done; \
         cat /etc/resolv.conf; \
         exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT unlisted.test:443 HTTP/1.1\\r\\n\\r\\n' >&3; head -1 <&3",
    );
    let out = text(&o);
    for v in ["http_proxy", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"] {
        assert!(out.contains(&format!("have-{v}")), "{out}");
    }
    assert!(
        out.contains("names resolve through the proxy only"),
        "{out}"
    );
    assert!(out.contains("HTTP/1.1 403"), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sandmux: proxy decisions:") && err.contains("DENIED  unlisted.test:443"),
        "{err}"
    );
}

/// Under `run` the proxy parses the agent's bytes on a thread of the
/// unconfined outer process, so that thread confines itself before it
/// serves: `no_new_privs` and a seccomp filter on it (and Landlock, which
/// /proc does not show). Control: the process's main thread has neither,
/// so the check tells the two apart.
#[test]
fn proxy_mode_run_confines_the_proxy_thread() {
    let ws = Ws::new();
    let state = host_dir();
    let mut child = run_cmd(&ws.path(), "registries", state.path(), "sleep 30")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let status = |tid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default()
    };
    let proxy = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|t| status(t).starts_with("Name:\tsandmux-proxy"))
    };
    // The thread is named as it starts and confines itself right after,
    // before it serves: wait for a filter on it (a thread that never
    // confined itself times out here).
    wait_for(
        || proxy().is_some_and(|t| !status(&t).contains("\nSeccomp:\t0\n")),
        Duration::from_secs(20),
        "the proxy's thread, confined",
    );
    let t = status(&proxy().unwrap());
    let main = status(&pid.to_string());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(
        t.contains("\nNoNewPrivs:\t1\n") && t.contains("\nSeccomp:\t2\n"),
        "{t}"
    );
    assert!(main.contains("\nSeccomp:\t0\n"), "{main}");
}

/// What the agent's processes hold of inotify counts against the host
/// user's budget, which the workspace guard and the human's editor share.
/// The sandbox's user namespace caps it (`[limits] inotify_watches`, 16,384,
/// and `inotify_instances`, 16): the probe, spending all it can from a
/// pane's seat, stops at the caps with ENOSPC and EMFILE, and while it
/// holds them the host user still makes an instance and 1,000 watches.
/// Control: a profile with higher caps lets the same probe past them, up
/// to half the host user's own limit.
#[test]
fn the_agent_cannot_spend_the_host_users_inotify_budget() {
    let ws = Ws::new();
    let probe = include_str!("probes/inotify.py");
    std::fs::write(ws.path().join("inotify.py"), probe).unwrap();
    let spend = |profile: &str, instances: &str| {
        let mut child = run(ws.path())
            .profile(profile)
            .cmd(["python3", "inotify.py", "/tmp/w", "40000", instances])
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            if std::io::BufRead::read_line(&mut out, &mut l).unwrap() == 0 || l == "held\n" {
                break;
            }
            lines.push(l.trim().to_string());
        }
        // The host user, while the agent holds all it could get.
        let host = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::empty());
        let host_ok = host.is_ok_and(|i| {
            let d = tempfile::tempdir().unwrap();
            (0..1000).all(|n| {
                let p = d.path().join(n.to_string());
                std::fs::create_dir(&p).unwrap();
                i.add_watch(&p, nix::sys::inotify::AddWatchFlags::IN_CREATE)
                    .is_ok()
            })
        });
        drop(child.stdin.take());
        child.wait().unwrap();
        (lines, host_ok)
    };
    let (lines, host_ok) = spend("default", "40");
    assert_eq!(
        lines,
        ["watches 16384 stopped 28", "instances 16 stopped 24"],
        "the caps"
    );
    assert!(
        host_ok,
        "the host user could not watch while the agent held its share"
    );
    let cfg = host_dir();
    let high = profile_file(cfg.path(), "high", "default", |t| {
        let e = t
            .replace("inotify_watches = 16384", "inotify_watches = 1048576")
            .replace("inotify_instances = 16", "inotify_instances = 1024");
        assert_ne!(e, t, "the profile edit did not apply");
        e
    });
    // Control: higher caps let it past.
    let (lines, _) = spend(high.to_str().unwrap(), "40");
    assert_eq!(
        lines,
        ["watches 40000 stopped none", "instances 40 stopped none"],
        "control: higher caps"
    );
    // Above half the host user's own limits, that half is the cap (read
    // from the report: spending it here would starve the tests beside).
    let host = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let want = format!(
        "inotify capped at {} watches, {} instances",
        (host("max_user_watches") / 2).min(1 << 20),
        (host("max_user_instances") / 2).min(1024)
    );
    let check = sandmux(&["check", "--json", "-p", high.to_str().unwrap(), "-w"])
        .arg(ws.path())
        .output()
        .unwrap();
    assert!(text(&check).contains(&want), "{want}: {}", text(&check));
}

/// `--toolchain go`: a Go root reached through a symlink is found from
/// `GOROOT`, bound read-only at its resolved path, first on `PATH`, with
/// its caches in the sandbox's home; an unknown name lists the known.
#[test]
fn a_lent_toolchain_is_on_path_read_only_with_its_caches_in_home() {
    let ws = Ws::new();
    let host = host_dir();
    let root = std::fs::canonicalize(host.path()).unwrap().join("go-1.0");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(
        root.join("bin/go"),
        "#!/bin/sh\necho \"go from $GOROOT cache $GOCACHE\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("bin/go"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let link = host.path().join("go");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let script = format!("go; touch {}/x 2>&1 | grep -c Read-only", root.display());
    let mut c = run(ws.path())
        .flag("--toolchain", "go")
        .script(&script)
        .command();
    let o = ran(c.env("GOROOT", &link));
    o.code(0);
    assert_eq!(
        o.stdout(),
        format!(
            "go from {} cache /home/sandmux/.cache/go-build\n1\n",
            root.display()
        ),
        "{o}"
    );
    run(ws.path())
        .flag("--toolchain", "ruby")
        .cmd(["true"])
        .output()
        .code(2)
        .says("sandmux lends rust, python, node, go");
}

/// Two starts at once: each clears away ended empty layers first, and must
/// never take the layer another start is still making. The first start is
/// held inside its making (strace delays its first `flock`, the new layer's
/// lock, by three seconds) while the second starts and ends; then the first
/// runs and keeps its work. Before layers were made under a staging name
/// the second removed the first's, half made, unlocked and empty (25 `serve`
/// started at once lost one). Control, before: an unlocked empty layer made
/// by hand, as the first's looked then, is removed by a start.
#[test]
fn a_start_never_takes_the_layer_another_start_is_making() {
    let (ws, other) = (Ws::new(), Ws::new());
    let host = host_dir();
    let state = host.path().join("state");
    let layers = state.join("sandmux/layers");
    let ghost = layers.join("0123456789ab");
    std::fs::create_dir_all(ghost.join("upper")).unwrap();
    std::fs::create_dir_all(ghost.join("work")).unwrap();
    let meta = format!(
        r#"{{"id":"0123456789ab","workspace":"{}","profile":"default","created":"2026-01-01T00:00:00Z","created_ns":0,"held_names":[]}}"#,
        other.path().display()
    );
    put(&ghost.join("meta.json"), &meta);
    run(other.path())
        .state(&state)
        .cmd(["true"])
        .output()
        .code(0);
    assert!(!ghost.exists(), "control: the unlocked empty layer stayed");
    // No layer is left, so the first start's first flock is its own layer's.
    let first = run(ws.path())
        .flag("--on-end", "keep")
        .state(&state)
        .script("echo mine > mine");
    let mut held = std::process::Command::new("strace");
    held.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=flock"])
        .args(["-e", "inject=flock:delay_enter=3000000:when=1"])
        .arg(bin())
        .args(first.args())
        .env("XDG_STATE_HOME", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut held = held.spawn().expect("strace (the CI installs it)");
    // The first start is inside its making: its layer's directory exists.
    let making = || std::fs::read_dir(&layers).is_ok_and(|mut d| d.next().is_some());
    wait_for(making, Duration::from_secs(20), "the first start's layer");
    let second = run(other.path()).state(&state).cmd(["true"]).output();
    let still = held.try_wait().unwrap().is_none();
    if !still {
        let _ = held.kill();
    }
    second.code(0);
    assert!(still, "the first start was not held while the second ran");
    let o = held.wait_with_output().unwrap();
    assert!(o.status.success(), "the held start: {}", text(&o));
    let kept: Vec<String> = std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}: {}", text(&o));
    let mine = layers.join(&kept[0]).join("upper/mine");
    assert_eq!(std::fs::read_to_string(mine).unwrap(), "mine\n");
}

/// `git = "commit"` with a copy-on-write workspace is refused, naming the
/// key (it used to crash at start: the guard had no tree to commit from).
#[test]
fn commit_mode_with_a_copy_on_write_workspace_is_refused() {
    let ws = Ws::new();
    let host = host_dir();
    let shown = sandmux(&["profile", "show", "default"]).output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout)
        .replace("\ngit = \"read-only\"", "\ngit = \"commit\"");
    assert!(text.contains("\ngit = \"commit\""), "{text}");
    let p = host.path().join("commit.toml");
    std::fs::write(&p, text).unwrap();
    run(ws.path())
        .profile(&p)
        .cmd(["true"])
        .output()
        .code(2)
        .says("git = \"commit\" needs [workspace] mode = \"live\"");
}

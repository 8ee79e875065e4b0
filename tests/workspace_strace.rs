//! The copy-on-write workspace's host side under `strace -f`: `run` (the
//! layer made, the sandbox, the end), `diff`, `apply` (files, the agent's
//! commits), `apply --undo`, `ps --all` and `discard`, on a layer full of
//! links the agent planted. No host-side process of sandmux (nor the git it
//! runs) opens, changes or executes a path inside the layer's `upper/`
//! with a link followed. Control: a host `cat` of a planted link is caught
//! by the same check.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::Path;
use std::process::Command;
use workspace_env::*;

const CALLS: &str =
    "trace=open,openat,creat,truncate,chmod,fchmodat,chown,lchown,fchownat,utimensat,execve";

/// Runs sandmux with `args` under `strace -f`, appending to `log`.
fn traced(log: &Path, state: &Path, args: &[&str]) -> std::process::Output {
    Command::new("strace")
        .args(["-f", "-qq", "-y", "-e", CALLS, "-A", "-o"])
        .arg(log)
        .arg(bin())
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .expect("strace (the CI installs it)")
}

/// The calls in `log` that name a path under `upper` and may follow a link
/// at its end: open/openat/creat without `O_NOFOLLOW`, the path-based
/// chmod/chown/truncate/execve, *at calls without `AT_SYMLINK_NOFOLLOW`.
fn following(log: &Path, upper: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap();
    text.lines()
        .filter(|l| {
            let Some((call, args)) = l
                .split_once(' ')
                .map(|(_, r)| r)
                .and_then(|r| r.split_once('('))
            else {
                return false;
            };
            // The path: an absolute string, or a directory fd's path
            // (`-y`) joined with a relative one.
            let path = full_path(args);
            if !path.contains(upper) {
                return false;
            }
            match call.trim() {
                "open" | "openat" | "creat" => !args.contains("O_NOFOLLOW"),
                "fchmodat" | "fchownat" | "utimensat" => !args.contains("AT_SYMLINK_NOFOLLOW"),
                _ => true,
            }
        })
        .map(str::to_string)
        .collect()
}

fn full_path(args: &str) -> String {
    let quoted = args.split('"').nth(1).unwrap_or_default().to_string();
    if quoted.starts_with('/') {
        return quoted;
    }
    let dir = args
        .split_once('<')
        .and_then(|(_, r)| r.split_once('>'))
        .map(|(d, _)| d.to_string())
        .unwrap_or_default();
    format!("{dir}/{quoted}")
}

#[test]
fn no_host_side_open_follows_a_link_in_the_layer() {
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join("a.txt"), "human\n");
    git_ok(&w, &["add", "-A"]);
    git_ok(&w, &["commit", "-q", "-m", "a"]);
    let host = host_dir();
    let state = host.path().join("state");
    let log = host.path().join("strace.log");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = r#"export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@x GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@x
echo agent > a.txt && git commit -qam agent
ln -s /etc/passwd link && ln -s / rootlink && mkdir -p d && ln -s /etc d/etc
rm -rf .git/refs/tags && ln -s /etc .git/refs/tags && ln -s /etc/hostname .git/packed-refs
mkdir -p .git/objects/zz && ln -s /etc/hostname .git/objects/zz/$(printf '%038d' 0)
echo done"#;
    let o = traced(
        &log,
        &state,
        &[
            "run",
            "--on-end",
            "keep",
            "-w",
            w.to_str().unwrap(),
            "--",
            "bash",
            "-c",
            script,
        ],
    );
    assert!(text(&o).contains("done"), "{}", text(&o));
    let id = layer_id(&text(&o));
    let upper = state.join("sandmux/layers").join(&id).join("upper");
    let upper = upper.to_str().unwrap().to_string();
    for args in [
        &["diff", id.as_str()][..],
        &["ps", "--all"],
        &["apply", id.as_str()],
        &["apply", id.as_str(), "--undo"],
        &["apply", id.as_str()],
    ] {
        let o = traced(&log, &state, args);
        assert!(o.status.code().is_some(), "{args:?}: {}", text(&o));
    }
    // The commits came in (the door read the layer's git data).
    assert!(git_ok(&w, &["for-each-ref"]).contains(&format!("refs/sandmux/{id}/main")));
    // Control, before the layer goes: a host process that follows a
    // planted link is caught.
    let control = host.path().join("control.log");
    let c = Command::new("strace")
        .args(["-f", "-qq", "-y", "-e", CALLS, "-o"])
        .arg(&control)
        .args(["cat", &format!("{upper}/link")])
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", text(&c));
    assert!(
        !following(&control, &upper).is_empty(),
        "control: the check sees nothing"
    );
    let o = traced(&log, &state, &["discard", &id]);
    assert!(o.status.success(), "{}", text(&o));
    let bad = following(&log, &upper);
    assert!(
        bad.is_empty(),
        "calls that may follow a link in the layer:\n{}",
        bad.join("\n")
    );
}

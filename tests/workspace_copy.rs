//! The copy workspace (`--workspace-mode copy`, and what copy-on-write
//! becomes where no overlay can be had: `workspace_nomount.rs`). The agent
//! works on a private copy; the host's tree does not change while it runs;
//! the door reads every kind of change the agent can make to the copy
//! (edits in place, renames of files and of whole directories, a removal
//! and a new directory of the same name, hard links, a touch that changes
//! nothing) and holds back what it holds back from an overlay's layer; a
//! workspace over the layer's bound is refused, naming the fix.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::Path;
use workspace_env::*;

fn copy_run(w: &Path, state: &Path, script: &str) -> String {
    let o = run(w)
        .state(state)
        .flag("--workspace-mode", "copy")
        .flag("--on-end", "keep")
        .script(script)
        .output();
    assert!(o.status.success(), "{o}");
    layer_id(&o.stderr())
}

/// Where the copy of layer `id` is, as its `meta.json` says (in the layer,
/// or as root under `/var/tmp/sandmux-copies`).
fn copy_dir(state: &Path, id: &str) -> std::path::PathBuf {
    let layer = state.join(format!("sandmux/layers/{id}"));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layer.join("meta.json")).unwrap()).unwrap();
    layer.join(meta["copy"].as_str().expect("a copy layer names its copy"))
}

/// Every path and its bytes (or link target) below `dir`, `.git` left out.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if rel == ".git" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                "dir".into()
            } else {
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

/// Each kind of change is read as the agent made it, and nothing else:
/// `diff --names-only` lists exactly these; the host's tree is untouched
/// until `apply`, then is the agent's copy (the untouched entries, a
/// touched-but-same file, and a file the human changed meanwhile that the
/// agent did not touch are the human's).
#[test]
fn every_kind_of_change_to_the_copy_is_read_and_nothing_else() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    for (p, t) in [
        ("edit.txt", "one\n"),
        ("same.txt", "same\n"),
        ("gone.txt", "bye\n"),
        ("olddir/a", "a\n"),
        ("olddir/deep/b", "b\n"),
        ("redo/x", "x\n"),
        ("redo/y", "y\n"),
        ("swap1/n", "first\n"),
        ("swap2/n", "second\n"),
        ("linked", "l\n"),
        ("human.txt", "h\n"),
    ] {
        put(&w.join(p), t);
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = "echo two >> edit.txt && touch same.txt && rm gone.txt && mv olddir newdir \
        && rm -rf redo && mkdir redo && echo x > redo/x && mv swap1 t && mv swap2 swap1 && mv t swap2 \
        && ln linked linked2 && ln -s edit.txt alias && echo new > fresh.txt \
        && pwd > where && echo done";
    let before = tree(&w);
    let id = copy_run(&w, &state, script);
    assert_eq!(
        tree(&w),
        before,
        "the host's tree changed while the copy was worked on"
    );
    // The human changes a file the agent did not touch: not the agent's.
    put(&w.join("human.txt"), "human's\n");
    let names = door_in(&state, &w, &["diff", &id, "--names-only"]);
    let listed = names.stdout();
    let got: Vec<&str> = listed
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    let want = [
        "alias",
        "edit.txt",
        "fresh.txt",
        "gone.txt",
        "linked2",
        "newdir",
        "newdir/a",
        "newdir/deep",
        "newdir/deep/b",
        "olddir",
        "redo/y",
        "swap1/n",
        "swap2/n",
        "where",
    ];
    assert_eq!(got, want, "{names}");
    let applied = door_in(&state, &w, &["apply", &id]);
    assert!(applied.status.success(), "{applied}");
    let t = tree(&w);
    let get = |p: &str| t.iter().find(|(r, _)| r == p).map(|(_, v)| v.as_str());
    assert_eq!(get("edit.txt"), Some("one\ntwo\n"));
    assert_eq!(get("same.txt"), Some("same\n"));
    assert_eq!(get("gone.txt"), None);
    assert_eq!(get("olddir"), None);
    assert_eq!(get("newdir/deep/b"), Some("b\n"));
    assert_eq!(get("redo/x"), Some("x\n"));
    assert_eq!(get("redo/y"), None);
    assert_eq!(get("swap1/n"), Some("second\n"));
    assert_eq!(get("swap2/n"), Some("first\n"));
    assert_eq!(get("linked2"), Some("l\n"));
    assert_eq!(get("alias"), None, "a link never comes in");
    assert_eq!(
        get("human.txt"),
        Some("human's\n"),
        "the human's change was undone"
    );
    // The agent worked at the copy's path, not the host's.
    let at = get("where").unwrap_or_default().trim().to_string();
    assert!(!at.is_empty() && Path::new(&at) != w, "{at}");
    assert!(door_in(&state, &w, &["discard", &id]).status.success());
}

/// The door holds back from a copy what it holds back from an overlay's
/// layer: a hook, git configuration and an `.envrc` the agent wrote stay
/// out; the human's `git commit` and `git status` after `apply` run none
/// of it. Control: the same files written on the host are obeyed. And the
/// host's tree by its own path is out of the agent's reach.
#[test]
fn the_copy_goes_through_the_same_door() {
    let host = host_dir();
    let marker = host.path().join("MARKER");
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let hook = format!("#!/bin/sh\ntouch {}\n", marker.display());
    let script = format!(
        "printf '{h}' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit \
         && printf '[core]\\n\\tfsmonitor = \"touch {m}\"\\n' >> .git/config \
         && echo 'touch {m}' > .envrc && echo more >> README \
         && (echo escaped > {host_path}/ESCAPED 2>/dev/null || echo refused) && echo done",
        h = hook.replace('\n', "\\n"),
        m = marker.display(),
        host_path = w.display(),
    );
    let id = copy_run(&w, &state, &script);
    assert!(
        !w.join("ESCAPED").exists(),
        "the agent wrote the host's tree by its path"
    );
    let names = door_in(&state, &w, &["diff", &id, "--names-only"]);
    assert!(
        names.stdout().lines().any(|l| l.starts_with("H .envrc")),
        "{names}"
    );
    assert!(
        names.stdout().lines().any(|l| l.starts_with("H .git")),
        "{names}"
    );
    let state_of = || {
        let ps = door_in(&state, &w, &["ps", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&ps.stdout()).unwrap();
        let row = v
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id.as_str())
            .cloned();
        let text = door_in(&state, &w, &["ps", "--all"]).stdout();
        let line = text
            .lines()
            .find(|l| l.starts_with(&id))
            .unwrap_or("")
            .to_string();
        (row.unwrap_or_default(), line)
    };
    let (row, line) = state_of();
    assert!(
        row["applied"] == false && line.contains(" ended "),
        "{row} {line}"
    );
    let applied = door_in(&state, &w, &["apply", &id]);
    assert!(applied.stdout().contains("applied README"), "{applied}");
    // Kept (what it held back is left), and `ps --all` says it was applied.
    let (row, line) = state_of();
    assert!(
        row["applied"] == true && line.contains(" applied "),
        "{row} {line}"
    );
    let _ = git(&w, &["status"]);
    let _ = git(&w, &["commit", "-qam", "human"]);
    assert!(!marker.exists(), "agent code ran on the host\n{applied}");
    assert!(!w.join(".envrc").exists());
    assert!(door_in(&state, &w, &["discard", &id]).status.success());
    // Control: the same hook on the host runs at the human's next commit.
    put(&w.join(".git/hooks/post-commit"), &hook);
    let o = std::process::Command::new("chmod")
        .args(["+x"])
        .arg(w.join(".git/hooks/post-commit"))
        .output()
        .unwrap();
    assert!(o.status.success());
    let _ = git(&w, &["commit", "-q", "--allow-empty", "-m", "control"]);
    assert!(
        marker.exists(),
        "positive control: the hook on the host runs"
    );
}

/// A workspace over the layer's bound is refused before anything starts,
/// naming the bound and the fixes; nothing is left behind.
#[test]
fn a_workspace_over_the_bound_is_refused_naming_the_fix() {
    let host = host_dir();
    let state = host.path().join("state");
    let small = profile_file(host.path(), "small", "default", |t| {
        t.replace("[workspace]\n", "[workspace]\nlayer_files = 5\n")
    });
    let ws = Ws::new();
    let w = ws.path();
    for i in 0..10 {
        put(&w.join(format!("f{i}")), "x\n");
    }
    let o = run(&w)
        .state(&state)
        .profile(&small)
        .flag("--workspace-mode", "copy")
        .script("echo started")
        .output();
    assert!(!o.status.success(), "{o}");
    assert!(!o.stdout().contains("started"), "{o}");
    for said in ["layer_files", "--workspace-mode live", "user namespaces"] {
        assert!(o.stderr().contains(said), "{said}\n{o}");
    }
    let layers = state.join("sandmux/layers");
    let left = std::fs::read_dir(&layers).map(|r| r.count()).unwrap_or(0);
    assert_eq!(left, 0, "a layer was left in {}", layers.display());
    // Control: the same profile over a workspace within the bound starts.
    let ws = Ws::new();
    put(&ws.path().join("one"), "x\n");
    let o = run(ws.path())
        .state(&state)
        .profile(&small)
        .flag("--workspace-mode", "copy")
        .flag("--on-end", "discard")
        .script("echo started")
        .output();
    assert!(o.stdout().contains("started"), "{o}");
}

/// A copy is as private as its layer: as root it lives outside root's
/// state directory (the agent's uid must reach it), behind a directory
/// only root and the agent's group can pass; another user cannot read a
/// file of it that it could read in the workspace (control).
#[test]
fn another_user_cannot_read_the_copy() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    put(&w.join("secret.txt"), "s3cret\n");
    let id = copy_run(&w, &state, "echo more >> secret.txt");
    let copy = copy_dir(&state, &id);
    assert!(copy.join("secret.txt").is_file(), "{}", copy.display());
    if !nix::unistd::geteuid().is_root() {
        // The same uid as the agent: the layer's 0700 directory is the gate.
        use std::os::unix::fs::PermissionsExt;
        let layers = state.join("sandmux/layers");
        let mode = std::fs::metadata(&layers).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    } else {
        let other = |p: &Path| {
            std::process::Command::new("setpriv")
                .args(["--reuid=65533", "--regid=65533", "--clear-groups", "cat"])
                .arg(p)
                .output()
                .unwrap()
        };
        // Control: readable by that user where the workspace lets it.
        for d in [w.as_path(), &copy] {
            let o = std::process::Command::new("chmod")
                .args(["a+rx"])
                .arg(d)
                .output()
                .unwrap();
            assert!(o.status.success());
        }
        let o = std::process::Command::new("chmod")
            .args(["a+r"])
            .arg(w.join("secret.txt"))
            .output()
            .unwrap();
        assert!(o.status.success());
        let mut up = w.clone();
        while let Some(p) = up.parent() {
            if !p.as_os_str().is_empty() && p != Path::new("/") {
                let _ = std::process::Command::new("chmod")
                    .args(["o+x"])
                    .arg(p)
                    .output();
            }
            up = p.to_path_buf();
        }
        let c = other(&w.join("secret.txt"));
        assert!(c.status.success(), "positive control: {}", text(&c));
        let o = other(&copy.join("secret.txt"));
        assert!(
            !o.status.success(),
            "another user read the copy: {}",
            text(&o)
        );
    }
    assert!(door_in(&state, &w, &["discard", &id]).status.success());
}

/// A directory of the copy the agent made unsearchable (read without
/// search: its names listed, none of them `stat`-able by the door's uid)
/// is unreadable, never read as removals: the human's files stay.
#[test]
fn a_directory_the_agent_locked_is_not_read_as_removed() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    put(&w.join("locked/keep.txt"), "mine\n");
    put(&w.join("other.txt"), "x\n");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = copy_run(&w, &state, "chmod 600 locked && echo y > other.txt");
    let names = door_in(&state, &w, &["diff", &id, "--names-only"]);
    assert!(names.stdout().contains("other.txt"), "{names}");
    assert!(
        !names.stdout().lines().any(|l| l.starts_with("D ")),
        "read as removed\n{names}"
    );
    let applied = door_in(&state, &w, &["apply", &id]);
    assert_eq!(
        std::fs::read_to_string(w.join("other.txt")).unwrap(),
        "y\n",
        "{applied}"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("locked/keep.txt")).unwrap(),
        "mine\n",
        "{applied}"
    );
    assert!(door_in(&state, &w, &["discard", &id]).status.success());
}

/// Nothing that changes the copy after its instance ended is read: a
/// process that outlived the sandbox, or the system's clean-up of old
/// files in `/var/tmp`, editing one file and removing another, makes
/// `diff` and `apply` refuse the copy whole (removals that are not the
/// agent's would otherwise remove the human's files). Control: the same
/// layer read before the change is read.
#[test]
fn a_copy_changed_after_its_end_is_refused() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    put(&w.join("a.txt"), "a\n");
    put(&w.join("b.txt"), "b\n");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = copy_run(&w, &state, "echo agent > new.txt");
    let before = door_in(&state, &w, &["diff", &id, "--names-only"]);
    assert!(before.stdout().contains("A new.txt"), "control: {before}");
    let copy = copy_dir(&state, &id);
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::write(copy.join("a.txt"), "late\n").unwrap();
    std::fs::remove_file(copy.join("b.txt")).unwrap();
    let after = door_in(&state, &w, &["diff", &id, "--names-only"]);
    assert!(!after.status.success(), "{after}");
    assert!(
        after.stderr().contains("changed after the instance ended"),
        "{after}"
    );
    let applied = door_in(&state, &w, &["apply", &id]);
    assert!(!applied.status.success(), "{applied}");
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(w.join("b.txt")).unwrap(), "b\n");
    assert!(!w.join("new.txt").exists());
    assert!(door_in(&state, &w, &["discard", &id]).status.success());
}

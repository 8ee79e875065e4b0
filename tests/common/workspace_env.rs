//! What `tests/workspace.rs` and `tests/workspace_git.rs` share: real host
//! repositories, `sandmux run` with a test's own state directory, and
//! profile variants.
#![allow(dead_code)]

use crate::common::*;
use std::path::Path;
use std::process::{Output, Stdio};

pub(crate) const PROFILES: [&str; 4] = ["default", "ci", "dev", "container"];

pub(crate) fn git(dir: &Path, args: &[&str]) -> Output {
    host_git(dir, args)
}

/// A host directory outside every tree the sandbox's view contains (`/tmp`
/// is a tmpfs inside): paths here are reachable only through what the guard
/// itself binds and grants.
pub(crate) fn outside_view() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sandmux-test-outside-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp")
}

pub(crate) fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git(dir, args);
    assert!(
        o.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A repository with one commit.
pub(crate) fn repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git_ok(dir, &["init", "-q", "-b", "main"]);
    put(&dir.join("README"), "hello\n");
    git_ok(dir, &["add", "README"]);
    git_ok(dir, &["commit", "-q", "-m", "first commit"]);
}

/// `sandmux run` with its own state directory (so the quarantine and the
/// manifests of one test never meet another's).
pub(crate) fn run_in(ws: &Path, profile: &str, state: &Path, script: &str) -> Output {
    run_cmd(ws, profile, state, script)
        .output()
        .expect("spawn sandmux")
}

/// [`run_in`] in the profile's own mode, the layer kept at the end.
pub(crate) fn run_cow(ws: &Path, profile: &str, state: &Path, script: &str) -> Output {
    run_cow_cmd(ws, profile, state, script)
        .output()
        .expect("spawn sandmux")
}

/// [`run_cmd`] started in the background once `ready` (a file it makes) exists.
pub(crate) fn run_background(
    ws: &Path,
    profile: &str,
    state: &Path,
    script: &str,
    ready: &str,
) -> std::process::Child {
    let child = run_cmd(ws, profile, state, script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sandmux");
    wait_for_file(&ws.join(ready));
    child
}

/// A profile derived from `base` with one edit, in `dir`.
pub(crate) fn variant(dir: &Path, name: &str, base: &str, from: &str, to: &str) -> String {
    let p = profile_file(dir, name, base, |t| {
        assert!(t.contains(from), "{from:?} not in profile {base}");
        t.replace(from, to)
    });
    p.to_str().unwrap().to_string()
}

/// The default profile with `[workspace] git = MODE`, saved as NAME.
pub(crate) fn git_variant(dir: &Path, name: &str, mode: &str) -> String {
    variant(
        dir,
        name,
        "default",
        "git = \"read-only\"",
        &format!("git = \"{mode}\""),
    )
}

/// The layer id a copy-on-write run names on stderr.
pub(crate) fn layer_id(stderr: &str) -> String {
    stderr
        .split("sandmux diff ")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .unwrap_or_else(|| panic!("no layer id in {stderr}"))
        .to_string()
}

/// `sandmux ARGS` with `state` as `XDG_STATE_HOME`.
pub(crate) fn door(state: &Path, args: &[&str]) -> Output {
    sandmux(args).env("XDG_STATE_HOME", state).output().unwrap()
}

/// `sandmux ARGS` in the workspace `w` with `state` as `XDG_STATE_HOME`,
/// its whole story kept for a failing assertion.
pub(crate) fn door_in(state: &Path, w: &Path, args: &[&str]) -> Ran {
    ran(sandmux(args).env("XDG_STATE_HOME", state).current_dir(w))
}

/// The instance's audit log, verified, and its records.
pub(crate) fn door_records(state: &Path, id: &str) -> Vec<serde_json::Value> {
    let dir = state.join("sandmux/audit");
    let tail = format!("-{id}.jsonl");
    let log = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(&tail))
        .unwrap_or_else(|| panic!("no log named after instance {id} in {}", dir.display()));
    let v = door(state, &["audit", "verify", log.to_str().unwrap()]);
    assert!(v.status.success(), "verify: {}", text(&v));
    std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

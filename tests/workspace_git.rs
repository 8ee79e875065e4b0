//! P8 for version control (W1): attacks on what host git obeys — `.git` in
//! a repository, nested and bare repositories, worktrees, submodules, a
//! repository created inside — made from inside `sandmux run`, then checked
//! with the real host git (`git status`, `git commit`) and a payload that
//! would leave a marker file; commit mode, where the agent commits into its
//! own repository and the human fetches. Every attack has a positive
//! control: the same script with the guard off leaves the marker.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::Path;
use std::process::Output;
use workspace_env::*;

/// Every way the agent could change what host git obeys in `.git` or a
/// nested repository, all tolerated to fail; `M` is the marker path.
const GIT_ATTACKS: &str = r#"
P="touch $M"
printf '[core]\n\tfsmonitor = %s\n' "$P" >> .git/config
git config core.fsmonitor "$P"
git config core.hooksPath "$PWD/hooks-evil"
printf '#!/bin/sh\n%s\n' "$P" > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
echo x > .git/hooks/post-checkout
mkdir -p evil && git init -q --bare evil/gd && git --git-dir=evil/gd config core.fsmonitor "$P"
echo "$PWD/evil/gd" > .git/commondir
echo "[include]" > cfg; mv cfg .git/config
ln -sf "$PWD/evil/gd/config" .git/config
mv .git .git-old; rm -rf .git; mkdir -p .git
git -C lib/inner config core.fsmonitor "$P"
mv lib lib2
git -C vendor/mirror.git config core.fsmonitor "$P"
git init -q fresh && git -C fresh config core.fsmonitor "$P"
mkdir -p other/sub && echo "gitdir: $PWD/evil/gd" > other/sub/.git
mkdir -p docs/objects docs/refs && echo 'ref: refs/heads/main' > docs/HEAD && printf '[core]\n\tfsmonitor = %s\n' "$P" > docs/config
git init -q docs/w2 && git -C docs/w2 config core.fsmonitor "$P"
mkdir -p docs/sub/objects docs/sub/refs && echo 'ref: refs/heads/main' > docs/sub/HEAD && printf '[core]\n\tfsmonitor = %s\n' "$P" > docs/sub/config
mkdir -p docs/worktrees/x && echo 'ref: refs/heads/main' > docs/worktrees/x/HEAD && echo ../.. > docs/worktrees/x/commondir
echo attacks-done
"#;

/// W1: a repository, a nested repository and a bare repository inside it,
/// under every built-in profile; then host git in each, and a control.
#[test]
fn git_control_plane_is_read_only_in_a_repository() {
    let cfg = host_dir();
    let unguarded = git_variant(cfg.path(), "unguarded", "unguarded");
    for profile in PROFILES.iter().copied().chain([unguarded.as_str()]) {
        let guarded = profile != unguarded;
        let ws = Ws::new();
        let w = ws.path();
        repo(&w);
        repo(&w.join("lib/inner"));
        git_ok(&w, &["init", "-q", "--bare", "vendor/mirror.git"]);
        put(&w.join("docs/notes.txt"), "the human's\n");
        // The human's own repository and tool configuration inside what
        // the agent will shape: never taken.
        repo(&w.join("docs/lib"));
        put(&w.join("docs/sub2/.envrc"), "export HUMAN=1\n");
        let host = host_dir();
        let marker = host.path().join("MARKER");
        let config_before = std::fs::read(w.join(".git/config")).unwrap();
        let script = format!("M={}\n{GIT_ATTACKS}", marker.display());
        let o = run_in(&w, profile, host.path(), &script);
        let t = text(&o);
        assert!(t.contains("attacks-done"), "{profile}: {t}");
        // The host user's next git commands, where a prompt would run them.
        for d in [
            w.clone(),
            w.join("lib/inner"),
            w.join("fresh"),
            w.join("other/sub"),
            w.join("vendor/mirror.git"),
            w.join("evil/gd"),
            w.join("docs"),
            w.join("docs/w2"),
            w.join("docs/sub"),
            w.join("docs/worktrees/x"),
        ] {
            if d.exists() {
                let _ = git(&d, &["status"]);
            }
        }
        let _ = git(&w, &["commit", "-q", "--allow-empty", "-m", "host commit"]);
        if guarded {
            assert!(
                !marker.exists(),
                "{profile}: agent code ran on the host\n{t}"
            );
            assert_eq!(
                std::fs::read(w.join(".git/config")).unwrap(),
                config_before,
                "{profile}"
            );
            assert!(t.contains("Read-only file system"), "{profile}: {t}");
            assert!(t.contains("Device or resource busy"), "{profile}: {t}");
            assert!(
                w.join("lib/inner/.git").is_dir() && !w.join("lib2").exists(),
                "{profile}"
            );
            // A directory shaped as a bare repository loses its HEAD, and
            // keeps the human's files beside the shape, the human's nested
            // repository and tool configuration; what the agent nested in
            // it is taken as anywhere else (the marker checks host git in
            // each).
            assert!(w.join("docs/lib/.git/HEAD").is_file(), "{profile}: {t}");
            assert!(w.join("docs/sub2/.envrc").is_file(), "{profile}: {t}");
            assert_eq!(
                std::fs::read_to_string(w.join("docs/notes.txt"))
                    .ok()
                    .as_deref(),
                Some("the human's\n"),
                "{profile}: {t}"
            );
            for planted in [
                "fresh/.git",
                "other/sub/.git",
                "evil/gd/HEAD",
                "docs/HEAD",
                "docs/w2/.git",
                "docs/sub/HEAD",
                "docs/worktrees/x/HEAD",
            ] {
                assert!(
                    std::fs::symlink_metadata(w.join(planted)).is_err(),
                    "{profile}: {planted} left in the workspace\n{t}"
                );
                assert!(
                    t.contains(planted),
                    "{profile}: {planted} not reported\n{t}"
                );
            }
            // Reading history inside works.
            let o = run_in(
                &w,
                profile,
                host.path(),
                "git log --oneline; git status --short | head -1; git -C lib/inner log --oneline",
            );
            assert_eq!(
                text(&o).matches("first commit").count(),
                2,
                "{profile}: {}",
                text(&o)
            );
            let quarantine = host.path().join("sandmux/quarantine");
            let kept: Vec<String> = walk_names(&quarantine);
            assert!(
                kept.iter().any(|n| n.ends_with("fresh_.git")),
                "{profile}: {kept:?}"
            );
        } else {
            assert!(
                marker.exists(),
                "positive control: the unguarded profile should let host git run agent code\n{t}"
            );
            assert!(t.contains("UNGUARDED") || o.status.success(), "{t}");
        }
    }
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}

/// W1: checkouts whose `.git` is a file (a linked worktree, a submodule), and
/// a workspace that is a subdirectory of a repository.
#[test]
fn git_control_plane_is_read_only_in_worktrees_and_submodules() {
    let cfg = host_dir();
    let unguarded = git_variant(cfg.path(), "unguarded", "unguarded");
    for profile in ["default", "container", unguarded.as_str()] {
        let guarded = profile != unguarded;
        let host = host_dir();
        let far = outside_view();
        let main = far.path().join("main");
        repo(&main);
        let ws = Ws::new();
        let wt = ws.path().join("wt");
        git_ok(&main, &["worktree", "add", "-q", wt.to_str().unwrap()]);
        let sup = ws.path().join("super");
        repo(&sup);
        git_ok(
            &sup,
            &["submodule", "add", "-q", main.to_str().unwrap(), "sub"],
        );
        git_ok(&sup, &["commit", "-q", "-m", "add sub"]);
        std::fs::create_dir_all(sup.join("dir")).unwrap();
        let marker = host.path().join("MARKER");
        let main_cfg = std::fs::read(main.join(".git/config")).unwrap();
        let attack = format!(
            r#"M={m}; P="touch $M"
git log --oneline | head -1
printf '[core]\n\tfsmonitor = %s\n' "$P" >> "$(git rev-parse --git-common-dir)/config"
printf '[core]\n\tfsmonitor = %s\n' "$P" >> "$(git rev-parse --git-dir)/config.worktree"
git config core.fsmonitor "$P"
mkdir -p ../evil && git init -q --bare ../evil/gd 2>/dev/null; git --git-dir=../evil/gd config core.fsmonitor "$P" 2>/dev/null
echo "gitdir: $(cd .. && pwd)/evil/gd" > .git; rm -f .git
echo attacks-done"#,
            m = marker.display()
        );
        // A linked worktree (its git directory lives outside the workspace).
        let o = run_in(&wt, profile, host.path(), &attack);
        let t = text(&o);
        assert!(t.contains("attacks-done"), "{profile}: {t}");
        let _ = git(&wt, &["status"]);
        // A submodule checkout (its git directory is the superproject's .git/modules/sub).
        let sub = sup.join("sub");
        let o2 = run_in(&sub, profile, host.path(), &attack);
        let t2 = text(&o2);
        let _ = git(&sub, &["status"]);
        // A subdirectory of a repository: the agent makes a repository of its own there.
        let o3 = run_in(
            &sup.join("dir"),
            profile,
            host.path(),
            &format!(
                "git init -q . && git config core.fsmonitor 'touch {}'; echo made=$?",
                marker.display()
            ),
        );
        let t3 = text(&o3);
        let _ = git(&sup.join("dir"), &["status"]);
        if guarded {
            assert!(
                !marker.exists(),
                "{profile}: agent code ran on the host\n{t}\n{t2}\n{t3}"
            );
            assert!(
                t.contains("first commit") && t2.contains("first commit"),
                "{profile}: history not readable inside\n{t}\n{t2}"
            );
            assert_eq!(
                std::fs::read(main.join(".git/config")).unwrap(),
                main_cfg,
                "{profile}"
            );
            assert!(
                wt.join(".git").is_file() && sub.join(".git").is_file(),
                "{profile}"
            );
            // The watch may take .git out while `git init` still writes it.
            assert!(t3.contains("made="), "{profile}: {t3}");
            assert!(
                !sup.join("dir/.git").exists(),
                "{profile}: the agent's repository stayed\n{t3}"
            );
            assert!(t3.contains("dir/.git"), "{profile}: not reported\n{t3}");
        } else {
            assert!(
                marker.exists(),
                "positive control: unguarded, host git should obey the agent\n{t}\n{t2}\n{t3}"
            );
        }
    }
}

/// `sandmux git fetch ID [extra]` with the test's state directory.
fn fetch(state: &Path, id: &str, extra: &[&str]) -> Output {
    let mut args = vec!["git", "fetch", id];
    args.extend_from_slice(extra);
    sandmux(&args)
        .env("XDG_STATE_HOME", state)
        .output()
        .unwrap()
}

/// Runs `script` in commit mode (it must print `planted=0`), then fetches
/// the instance's repository: the id and the fetch's output.
fn plant_and_fetch(w: &Path, profile: &str, state: &Path, script: &str) -> (String, Output) {
    let t = text(&run_in(w, profile, state, script));
    assert!(t.contains("planted=0"), "{t}");
    let id = fetch_id(&t);
    let f = fetch(state, &id, &[]);
    (id, f)
}

fn fetch_id(stderr: &str) -> String {
    stderr
        .split("sandmux git fetch ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no fetch line in: {stderr}"))
        .to_string()
}

/// Commit mode: the agent commits into its own repository; the workspace's
/// `.git` is never written; the human fetches, and nothing the agent wrote
/// into its repository's config or hooks runs on the host. A repository the
/// agent reshaped is refused; a live instance is refused.
#[test]
fn commit_mode_agent_commits_and_the_human_fetches() {
    let cfg = host_dir();
    let commit = git_variant(cfg.path(), "commit", "commit");
    let unguarded = git_variant(cfg.path(), "unguarded", "unguarded");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    // The state directory outside the view, as ~/.local/state is.
    let host = outside_view();
    let marker = host.path().join("MARKER");
    let main_before = git_ok(&w, &["rev-parse", "main"]);
    let config_before = std::fs::read(w.join(".git/config")).unwrap();
    let script = format!(
        r#"P="touch {m}"
echo change >> README && git add README && git commit -qm "agent change" && echo committed
git config core.fsmonitor "$P"; git config core.hooksPath /tmp
printf '#!/bin/sh\n%s\n' "$P" > .git/hooks/post-commit; chmod +x .git/hooks/post-commit
mv .git/config cfg; rm -rf .git/hooks; mv .git/objects .git/o2
echo /nonexistent > .git/objects/info/alternates
echo attacks-done"#,
        m = marker.display()
    );
    let o = run_in(&w, &commit, host.path(), &script);
    let t = text(&o);
    assert!(t.contains("committed") && t.contains("attacks-done"), "{t}");
    assert_eq!(
        git_ok(&w, &["rev-parse", "main"]),
        main_before,
        "the workspace's own refs moved"
    );
    assert_eq!(std::fs::read(w.join(".git/config")).unwrap(), config_before);
    let id = fetch_id(&t);
    let f = fetch(host.path(), &id, &[]);
    assert!(f.status.success(), "{}", text(&f));
    let log = git_ok(
        &w,
        &["log", "--format=%s", &format!("refs/sandmux/{id}/main")],
    );
    assert!(
        log.contains("agent change") && log.contains("first commit"),
        "{log}"
    );
    // The next step fetch names works: the edits are already in the
    // working tree, and the reset makes the commits main's history.
    let theirs = format!("refs/sandmux/{id}/main");
    assert!(
        text(&f).contains("next: ") && text(&f).contains(&format!("`git reset {theirs}`")),
        "{}",
        text(&f)
    );
    git_ok(&w, &["reset", "-q", &theirs]);
    assert_eq!(
        git_ok(&w, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    assert_eq!(
        git_ok(&w, &["log", "-1", "--format=%s"]).trim(),
        "agent change"
    );
    let _ = git(&w, &["status"]);
    let _ = git(&w, &["commit", "-q", "--allow-empty", "-m", "host"]);
    assert!(!marker.exists(), "agent code ran on the host\n{t}");
    // --prune removes the agent's repository after fetching.
    let f = fetch(host.path(), &id, &["--prune"]);
    assert!(
        f.status.success() && text(&f).contains("removed"),
        "{}",
        text(&f)
    );
    assert!(!host.path().join(format!("sandmux/git/{id}")).exists());

    // A branch that rewrites the human's history gets no reset advice:
    // the reset would drop the human's commit ("host") without a trace.
    let (id, f) = plant_and_fetch(
        &w,
        &commit,
        host.path(),
        "git reset -q --soft HEAD~1 && echo x >> README && git commit -qam rewrite; echo planted=$?",
    );
    assert!(f.status.success(), "{}", text(&f));
    assert!(
        text(&f).contains("review before anything else")
            && text(&f).contains("does not continue your history")
            && !text(&f).contains("`git reset"),
        "{}",
        text(&f)
    );
    let _ = fetch(host.path(), &id, &["--prune"]);
    git_ok(&w, &["checkout", "-q", "--", "README"]);

    // A reshaped repository (commondir redirect to a config of the agent's) is refused.
    let (_, f) = plant_and_fetch(&w, &commit, host.path(), &format!(
        "mkdir -p evil && printf '[core]\\n\\tfsmonitor = touch {}\\n' > evil/config && echo \"$PWD/evil\" > .git/commondir; echo planted=$?",
        marker.display()
    ));
    assert_eq!(f.status.code(), Some(1), "{}", text(&f));
    assert!(text(&f).contains("commondir"), "{}", text(&f));
    assert!(!marker.exists());

    // Links in the agent's repository are refused: the host-side
    // upload-pack would follow a link to another repository of the host.
    // (FIFOs cannot be made inside: tests/escape.rs.)
    let secret = host.path().join("secret");
    repo(&secret);
    let (id, f) = plant_and_fetch(
        &w,
        &commit,
        host.path(),
        &format!(
            "rm -f .git/packed-refs && ln -s {}/.git/packed-refs .git/packed-refs; echo planted=$?",
            secret.display()
        ),
    );
    assert_eq!(f.status.code(), Some(1), "{}", text(&f));
    assert!(
        text(&f).contains("packed-refs is neither a plain file nor a directory"),
        "{}",
        text(&f)
    );
    // Positive control: a plain git fetch from that repository follows the
    // link and brings the other repository's commit in.
    let agent = host.path().join(format!("sandmux/git/{id}/agent.git"));
    std::fs::remove_dir_all(agent.join("objects/pack")).unwrap();
    std::os::unix::fs::symlink(secret.join(".git/objects/pack"), agent.join("objects/pack"))
        .unwrap();
    git_ok(&secret, &["gc", "-q"]);
    let _ = git(
        &w,
        &[
            "fetch",
            "-q",
            agent.to_str().unwrap(),
            "+refs/heads/*:refs/leak/*",
        ],
    );
    assert_eq!(
        git(&w, &["rev-parse", "refs/leak/main"]).stdout,
        git_ok(&secret, &["rev-parse", "main"]).into_bytes(),
        "positive control: the unchecked fetch should have followed the links"
    );

    // A live instance is refused (the agent could still change its repository).
    let mut live = run_background(&w, &commit, host.path(), "touch LIVE; sleep 30", "LIVE");
    let ids: Vec<String> = std::fs::read_dir(host.path().join("sandmux/guard"))
        .unwrap()
        .flatten()
        .map(|e| {
            e.file_name()
                .to_string_lossy()
                .trim_end_matches(".json")
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let f = fetch(host.path(), &ids[0], &[]);
    assert!(text(&f).contains("still running"), "{}", text(&f));
    live.kill().unwrap();
    live.wait().unwrap();

    // Positive control: unguarded, the same hook runs on the host's next commit.
    let hook = format!(
        "printf '#!/bin/sh\\ntouch {}\\n' > .git/hooks/post-commit; chmod +x .git/hooks/post-commit",
        marker.display()
    );
    let o = run_in(&w, &unguarded, host.path(), &hook);
    let _ = git(&w, &["commit", "-q", "--allow-empty", "-m", "host again"]);
    assert!(
        marker.exists(),
        "positive control: the agent's hook should run unguarded\n{}",
        text(&o)
    );
}

/// `[workspace] new_repositories = "allow"`: a repository the agent creates
/// stays, and the end of the instance says so; the default takes it.
#[test]
fn new_repositories_can_be_allowed_and_are_listed() {
    let cfg = host_dir();
    let allow = variant(
        cfg.path(),
        "allow",
        "default",
        "new_repositories = \"quarantine\"",
        "new_repositories = \"allow\"",
    );
    for (profile, stays) in [(allow.as_str(), true), ("default", false)] {
        let ws = Ws::new();
        let w = ws.path();
        let state = host_dir();
        let o = run_in(
            &w,
            profile,
            state.path(),
            "git init -q lib/made && echo made",
        );
        let t = text(&o);
        assert!(t.contains("made"), "{t}");
        assert_eq!(w.join("lib/made/.git").is_dir(), stays, "{profile}: {t}");
        if stays {
            assert!(
                t.contains("left in place") && t.contains("lib/made/.git"),
                "{t}"
            );
        } else {
            assert!(t.contains("new repository"), "{t}");
        }
    }
}

//! The door by construction: what the human's tools would obey stays out
//! as the tools resolve it (git's includes of includes, any configuration
//! word that names a tree path, a home directory's start files and PATH,
//! other agents' instruction files); applied is what was reviewed, or
//! nothing; the human's bytes are never lost (judged by content, not by
//! `git status`); one apply is bounded by the free space, holes kept. Each
//! attack is checked on the host with the human's own programs, beside a
//! positive control that shows the same bytes obeyed or lost without the
//! door.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::Path;
use workspace_env::*;

/// `run --on-end keep` with `state`; the layer's id.
fn keep(w: &Path, state: &Path, script: &str) -> String {
    let o = run(w)
        .state(state)
        .flag("--on-end", "keep")
        .script(script)
        .output();
    assert!(o.status.success(), "{o}");
    layer_id(&o.stderr())
}

/// Class 1: git reads an include of an include relative to the including
/// file, and a key the old list did not know (`diff.external`) runs a
/// program; what those name comes in held back, and the human's `git diff`
/// and `git status` run nothing of the agent's. Control: the same files
/// written on the host are obeyed.
#[test]
fn what_git_would_read_stays_out_as_git_resolves_it() {
    let host = host_dir();
    let marker = host.path().join("MARKER");
    let state = host.path().join("state");
    let setup = |w: &Path| {
        repo(w);
        git_ok(w, &["config", "include.path", "../conf/a.inc"]);
        git_ok(w, &["config", "diff.external", "scripts/differ"]);
        // A path with a space, and one behind a variable.
        git_ok(w, &["config", "core.hooksPath", "git hooks"]);
        git_ok(w, &["config", "alias.lint", "!$PWD/scripts/lint.sh"]);
        put(&w.join("conf/a.inc"), "[include]\n\tpath = deep/b.inc\n");
        put(&w.join("conf/deep/.keep"), "");
    };
    let attack = format!(
        "mkdir -p conf/deep scripts tools && printf '[core]\\n\\tfsmonitor = tools/fsm\\n' > conf/deep/b.inc \
         && printf '#!/bin/sh\\ntouch {m}\\n' > tools/fsm && printf '#!/bin/sh\\ntouch {m}\\n' > scripts/differ \
         && mkdir -p 'git hooks' && printf '#!/bin/sh\\ntouch {m}\\n' > 'git hooks/pre-commit' \
         && printf '#!/bin/sh\\ntouch {m}\\n' > scripts/lint.sh && chmod +x 'git hooks/pre-commit' scripts/lint.sh \
         && chmod +x tools/fsm scripts/differ && echo more >> README && echo done",
        m = marker.display()
    );
    let ws = Ws::new();
    let w = ws.path();
    setup(&w);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = keep(&w, &state, &attack);
    let names = door_in(&state, &w, &["diff", &id, "--names-only"]);
    for held in [
        "conf/deep/b.inc",
        "tools/fsm",
        "scripts/differ",
        "git hooks/pre-commit",
        "scripts/lint.sh",
    ] {
        assert!(
            names
                .stdout()
                .lines()
                .any(|l| l.starts_with(&format!("H {held} "))),
            "{held} not held\n{names}"
        );
    }
    // Naming a held path never brings it.
    door_in(&state, &w, &["apply", &id, "scripts", "tools"]);
    assert!(!w.join("scripts/differ").exists() && !w.join("tools/fsm").exists());
    door_in(&state, &w, &["apply", &id]).code(0);
    assert_eq!(
        std::fs::read_to_string(w.join("README")).unwrap(),
        "hello\nmore\n"
    );
    for p in ["conf/deep/b.inc", "tools/fsm", "scripts/differ"] {
        assert!(!w.join(p).exists(), "{p} came in");
    }
    let _ = host_git(&w, &["status"]);
    let _ = host_git(&w, &["diff"]);
    let _ = host_git(&w, &["commit", "-q", "--allow-empty", "-m", "human"]);
    let _ = host_git(&w, &["lint"]);
    assert!(!marker.exists(), "the human's git ran the agent's code");
    // Control: the same bytes written on the host are obeyed.
    let ws = Ws::new();
    let c = ws.path();
    setup(&c);
    let o = ran(std::process::Command::new("bash")
        .args(["-c", &attack])
        .current_dir(&c));
    assert!(o.status.success(), "{o}");
    for (args, what) in [
        (&["status"][..], "fsmonitor"),
        (&["diff"][..], "diff.external"),
        (
            &["commit", "-q", "--allow-empty", "-m", "h"][..],
            "the hooks path with a space",
        ),
        (&["lint"][..], "the alias behind $PWD"),
    ] {
        let _ = std::fs::remove_file(&marker);
        let _ = host_git(&c, args);
        assert!(marker.exists(), "control: git did not obey {what}");
    }
}

/// Class 2 and 6: a workspace that is a home directory (a `.bashrc` on the
/// host) keeps its dot paths and `bin/` out (a logout script, an
/// environment file, a `git` early on PATH); other agents' instruction
/// files (a known name at any depth, a `rules` folder of any dot
/// directory) are held back and shown apart. Control: in a workspace that
/// is no home, the same logout script is ordinary content and comes in;
/// an instruction-like name outside the rules does too.
#[test]
fn a_home_and_other_agents_instructions_stay_out() {
    let host = host_dir();
    let state = host.path().join("state");
    let script = "mkdir -p bin .config/environment.d .newtool/rules sub docs/rules \
        && echo 'rm -rf ~' > .bash_logout && echo LD_PRELOAD=/x.so > .config/environment.d/e.conf \
        && printf '#!/bin/sh\\n' > bin/git && chmod +x bin/git \
        && echo 'obey me' > .newtool/rules/r.md && echo 'obey me' > sub/Claude.md \
        && echo text > docs/rules/x.md && echo done";
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join(".bashrc"), "# the human's\n");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = keep(&w, &state, script);
    let d = door_in(&state, &w, &["diff", &id, "--names-only"]);
    let out = d.stdout();
    let apart = out
        .split("# instructions for coding agents")
        .nth(1)
        .unwrap_or_else(|| panic!("no instructions section\n{d}"));
    for p in [".newtool/rules/r.md", "sub/Claude.md"] {
        assert!(apart.contains(&format!("H {p} ")), "{p}\n{d}");
    }
    for p in [".bash_logout", ".config/environment.d/e.conf", "bin/git"] {
        assert!(out.contains(&format!("H {p} ")), "{p}\n{d}");
    }
    door_in(&state, &w, &["apply", &id]).code(0);
    for p in [
        ".bash_logout",
        ".config",
        "bin",
        ".newtool",
        "sub/Claude.md",
    ] {
        assert!(!w.join(p).exists(), "{p} came in");
    }
    assert!(w.join("docs/rules/x.md").exists());
    // Control: no home, the logout script is content.
    let ws = Ws::new();
    let c = ws.path();
    repo(&c);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = keep(&c, &state, script);
    door_in(&state, &c, &["apply", &id]).code(0);
    assert!(c.join(".bash_logout").exists(), "control: not applied");
}

/// The layer of the only running instance in `state`.
fn running_layer(state: &Path) -> String {
    let dir = state.join("sandmux/layers");
    for _ in 0..200 {
        if let Some(e) = std::fs::read_dir(&dir).ok().and_then(|mut d| d.next()) {
            return e.unwrap().file_name().to_string_lossy().into_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no layer in {}", dir.display());
}

/// Class 4: `diff` of a running instance says so first and gives no
/// digest; the agent changes a file after the human read it; a plain
/// `apply` afterwards refuses (that review was of a running instance) and
/// writes nothing; an `--expect` no diff showed refuses; a `diff` after the
/// end gives the digest that brings the bytes it showed. Control: with no
/// review, a plain apply brings whatever is there.
#[test]
fn applied_is_what_was_reviewed_or_nothing() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = "echo reviewed > out.txt && touch ready && sleep 3 && echo swapped > out.txt";
    let mut child = run(&w)
        .state(&state)
        .flag("--on-end", "keep")
        .script(script)
        .command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let id = running_layer(&state);
    let upper = state.join("sandmux/layers").join(&id).join("upper");
    wait_for_file(&upper.join("ready"));
    let d = door_in(&state, &w, &["diff", &id]);
    let out = d.stdout();
    assert!(
        out.starts_with(&format!("# instance {id} is still running")),
        "{d}"
    );
    assert!(
        out.contains("+reviewed") && out.contains("# no digest while"),
        "{d}"
    );
    assert!(child.wait().unwrap().success());
    let a = door_in(&state, &w, &["apply", &id]);
    a.code(2).says("while it ran");
    let e = door_in(
        &state,
        &w,
        &["apply", &id, "--expect", "0123456789abcdef01234567"],
    );
    e.code(2).says("no `sandmux diff` of this layer showed it");
    assert!(!w.join("out.txt").exists(), "something was applied");
    let d = door_in(&state, &w, &["diff", &id]);
    assert!(d.stdout().contains("+swapped"), "{d}");
    let now = d
        .stdout()
        .split("# digest ")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .unwrap_or_else(|| panic!("no digest\n{d}"))
        .to_string();
    door_in(&state, &w, &["apply", &id, "--expect", &now]).code(0);
    assert_eq!(
        std::fs::read_to_string(w.join("out.txt")).unwrap(),
        "swapped\n"
    );
    // Control: no review, no check.
    let ws = Ws::new();
    let c = ws.path();
    repo(&c);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = keep(&c, &state, "echo swapped > out.txt");
    door_in(&state, &c, &["apply", &id]).code(0);
    assert!(c.join("out.txt").exists());
}

/// Class 3: a local edit `git status` does not show (skip-worktree) is
/// replaced by `run`'s automatic apply; its bytes are not in git, so the
/// layer is kept with them and `apply --undo` gives them back. Control:
/// `git status` says the tree is clean (a rule by status would drop the
/// layer), and a replaced file whose bytes git has lets the layer go.
#[test]
fn on_end_apply_keeps_every_byte_git_does_not_have() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join("cfg.txt"), "committed\n");
    git_ok(&w, &["add", "cfg.txt"]);
    git_ok(&w, &["commit", "-q", "-m", "cfg"]);
    put(&w.join("cfg.txt"), "my local edit\n");
    git_ok(&w, &["update-index", "--skip-worktree", "cfg.txt"]);
    assert_eq!(
        git_ok(&w, &["status", "--porcelain"]),
        "",
        "control: status shows it"
    );
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = run(&w)
        .state(&state)
        .script("echo agent > cfg.txt")
        .output();
    o.says("kept 1 of your files");
    let id = layer_id(&o.stderr());
    assert_eq!(
        std::fs::read_to_string(w.join("cfg.txt")).unwrap(),
        "agent\n"
    );
    door_in(&state, &w, &["apply", &id, "--undo"]).code(0);
    assert_eq!(
        std::fs::read_to_string(w.join("cfg.txt")).unwrap(),
        "my local edit\n"
    );
    // Control: bytes git has (README, committed) let the layer go.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = run(&w).state(&state).script("echo agent > README").output();
    o.says("its layer is removed");
    // The agent commits the human's only copy in a repository of its own,
    // then overwrites it: the repository host git makes for those commits
    // does not count.
    let ws = Ws::new();
    let n = ws.path();
    put(&n.join("notes.txt"), "mine, never committed\n");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = run(&n)
        .state(&state)
        .script("export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@x GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@x; git init -q && git add notes.txt && git commit -qm mine && echo agent > notes.txt")
        .output();
    o.says("kept 1 of your files");
    let id = layer_id(&o.stderr());
    door_in(&state, &n, &["apply", &id, "--undo"]).code(0);
    assert_eq!(
        std::fs::read_to_string(n.join("notes.txt")).unwrap(),
        "mine, never committed\n"
    );
}

/// Class 5: sparse files that cost the layer nothing add up to more than
/// the workspace's free space: `apply` refuses before writing anything;
/// one of them alone comes in with its holes kept. The layer's own bound
/// counts apparent sizes (the default profile's 16 GiB ends such a run).
#[test]
fn one_apply_is_bounded_by_the_free_space_and_keeps_holes() {
    let host = host_dir();
    let state = host.path().join("state");
    let cfg = host_dir();
    let big = profile_file(cfg.path(), "big", "default", |t| {
        t.replace("[workspace]\n", "[workspace]\nlayer_bytes = \"4096GiB\"\n")
    });
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    let free = nix::sys::statvfs::statvfs(&w).unwrap();
    let free = free.blocks_available() * free.fragment_size();
    let each = 7u64 << 30;
    let n = free / each + 2;
    let script =
        format!("for i in $(seq 1 {n}); do truncate -s {each} f$i || exit 1; done; echo done");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = run(&w)
        .profile(&big)
        .state(&state)
        .flag("--on-end", "keep")
        .script(&script)
        .output();
    o.says("done");
    let id = layer_id(&o.stderr());
    let a = door_in(&state, &w, &["apply", &id]);
    a.code(2).says("free: nothing applied");
    assert!(!w.join("f1").exists(), "a file was written");
    door_in(&state, &w, &["apply", &id, "f1"]).code(0);
    let m = std::fs::metadata(w.join("f1")).unwrap();
    assert_eq!(m.len(), each);
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&m) * 512 < 1 << 20,
        "the holes were filled"
    );
    door_in(&state, &w, &["discard", &id]).code(0);
    // The default bound counts apparent size.
    let o = run(&w)
        .state(&state)
        .script(&format!("{script}; sleep 20"))
        .output();
    o.says("layer_bytes");
}

/// Real projects: what git ignores (the host's rules, and an ignore file
/// the agent wrote) is one line per top directory in review and stays in
/// the layer on `apply`; the agent's `*` ignore file hides its files from
/// review and from apply alike. `diff PATHS` shows only those paths.
/// Control: `--include-ignored` shows them path by path and brings them.
#[test]
fn what_git_ignores_is_one_line_and_stays_unless_asked() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join(".gitignore"), "target/\n");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = "mkdir -p target/debug sub src && for i in $(seq 1 50); do echo $i > target/debug/f$i; done \
        && printf '*\\n' > sub/.gitignore && echo hidden > sub/secret.txt && echo code > src/lib.rs && echo done";
    let id = keep(&w, &state, script);
    let only = door_in(&state, &w, &["diff", &id, "src", "--names-only"]);
    assert!(
        only.stdout()
            .lines()
            .filter(|l| l.starts_with(['A', 'M', 'D', 'H', 'I']))
            .count()
            == 2,
        "{only}"
    );
    let d = door_in(&state, &w, &["diff", &id, "--names-only"]);
    let out = d.stdout();
    assert!(
        out.lines()
            .any(|l| l.starts_with("I target (") && l.contains("paths git ignores")),
        "{d}"
    );
    assert!(out.lines().any(|l| l.starts_with("I sub (")), "{d}");
    assert!(!out.contains("target/debug"), "{d}");
    assert!(out.lines().any(|l| l == "A src/lib.rs (file)"), "{d}");
    let a = door_in(&state, &w, &["apply", &id]);
    a.code(0).says("left target");
    assert!(w.join("src/lib.rs").exists());
    assert!(!w.join("target").exists() && !w.join("sub/secret.txt").exists());
    // Control: asked for, they are shown and come in.
    let d = door_in(
        &state,
        &w,
        &["diff", &id, "--names-only", "--include-ignored"],
    );
    assert!(d.stdout().contains("A target/debug/f7 (file)"), "{d}");
    door_in(&state, &w, &["apply", &id, "--include-ignored"]).code(0);
    assert!(w.join("target/debug/f7").exists() && w.join("sub/secret.txt").exists());
}

/// `apply --undo` then `apply` of the same layer: the undo's renames gave
/// the human's files new ctimes, but they are exactly what the first apply
/// found, so the layer applies again cleanly (rewritten, added and removed
/// paths, a removed directory), and undoes again to the human's bytes.
/// Control: a real edit by the human after the undo (content, or only a
/// `chmod`) is still a conflict, left as the human made it.
#[test]
fn an_undone_layer_applies_again_and_a_later_edit_is_a_conflict() {
    let host = host_dir();
    let state = host.path().join("state");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    for (p, t) in [
        ("a.txt", "mine a\n"),
        ("b.txt", "mine b\n"),
        ("gone.txt", "mine gone\n"),
        ("old/x.txt", "mine x\n"),
    ] {
        put(&w.join(p), t);
    }
    git_ok(&w, &["add", "-A"]);
    git_ok(&w, &["commit", "-q", "-m", "files"]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let id = keep(
        &w,
        &state,
        "echo agent a > a.txt && echo agent b > b.txt && echo new > new.txt && rm gone.txt && rm -r old",
    );
    let read = |p: &str| std::fs::read_to_string(w.join(p)).ok();
    let human = |read: &dyn Fn(&str) -> Option<String>| {
        assert_eq!(read("a.txt").as_deref(), Some("mine a\n"));
        assert_eq!(read("b.txt").as_deref(), Some("mine b\n"));
        assert_eq!(read("gone.txt").as_deref(), Some("mine gone\n"));
        assert_eq!(read("old/x.txt").as_deref(), Some("mine x\n"));
        assert_eq!(read("new.txt"), None);
    };
    for round in 0..2 {
        let a = door_in(&state, &w, &["apply", &id]);
        a.code(0);
        assert!(!a.stdout().contains("conflict"), "round {round}: {a}");
        assert_eq!(read("a.txt").as_deref(), Some("agent a\n"), "round {round}");
        assert_eq!(read("new.txt").as_deref(), Some("new\n"), "round {round}");
        assert!(!w.join("gone.txt").exists() && !w.join("old").exists());
        door_in(&state, &w, &["apply", &id, "--undo"]).code(0);
        human(&read);
    }
    // Control: the human edits one file and chmods another after the undo.
    put(&w.join("a.txt"), "mine a, edited after the undo\n");
    let b = w.join("b.txt");
    let mut perm = std::fs::metadata(&b).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    std::fs::set_permissions(&b, perm).unwrap();
    let a = door_in(&state, &w, &["apply", &id]);
    a.code(3);
    let out = a.stdout();
    assert!(out.contains("conflict a.txt (changed on the host"), "{a}");
    assert!(out.contains("conflict b.txt (changed on the host"), "{a}");
    assert_eq!(
        read("a.txt").as_deref(),
        Some("mine a, edited after the undo\n")
    );
    assert_eq!(read("b.txt").as_deref(), Some("mine b\n"));
}

//! P8 by construction: the copy-on-write workspace (`[workspace] mode =
//! "copy-on-write"`) and its door (`sandmux diff`, `apply`, `discard`),
//! attacked from inside `sandmux run` and checked on the host with real git
//! and patch. `workspace.rs` is live mode's guard.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use workspace_env::*;

/// Every file and directory under `root` (`.git` included): path, mode and
/// bytes, for "the host's tree did not change".
fn tree_snapshot(root: &std::path::Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let m = p.symlink_metadata().unwrap();
            let bytes = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                vec![]
            };
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push((p.strip_prefix(root).unwrap().to_path_buf(), m.mode(), bytes));
        }
    }
    out.sort();
    out
}

/// What the agent does in the copy-on-write tests: its own work, and every
/// kind of control a host program would obey.
fn cow_script(marker: &std::path::Path) -> String {
    format!(
        r#"echo changed >> README && rm gone.txt && echo new > new.txt && mkdir -p src && echo 'fn main() {{}}' > src/main.rs
git config core.fsmonitor "touch {m}" && echo fsmonitor=$(git config core.fsmonitor)
printf '#!/bin/sh\ntouch {m}\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout
echo "touch {m}" > .envrc
git init -q sub && git -C sub -c user.name=a -c user.email=a@b commit -q --allow-empty -m agent && echo sub-commit=$?
chmod 0777 . && echo done"#,
        m = marker.display()
    )
}

/// P8 by construction (`[workspace] mode = "copy-on-write"`): the agent
/// edits the workspace freely (files, its git config and hooks, `.envrc`, a
/// repository of its own, the top's mode) and the host's tree does not
/// change at all — bytes and modes of every file, `.git` included — so
/// host git runs nothing. `sandmux diff ID` shows the work, holds control
/// back, and its text applied with `patch -p1` brings exactly the work in;
/// `discard` removes the layer. Control: the same script in live mode with
/// the guard off reaches host git.
#[test]
fn copy_on_write_leaves_the_host_tree_unchanged_and_diff_shows_the_work() {
    let cfg = host_dir();
    for profile in PROFILES {
        let file = std::path::PathBuf::from(profile);
        let ws = Ws::new();
        let w = ws.path();
        repo(&w);
        put(&w.join("gone.txt"), "bye\n");
        git_ok(&w, &["add", "gone.txt"]);
        git_ok(&w, &["commit", "-q", "-m", "second"]);
        let host = host_dir();
        let marker = host.path().join("MARKER");
        let before = tree_snapshot(&w);
        let state = host.path().join("state");
        let o = run_cow(&w, file.to_str().unwrap(), &state, &cow_script(&marker));
        let t = text(&o);
        assert!(
            t.contains("done") && t.contains("sub-commit=0"),
            "{profile}: {t}"
        );
        assert!(
            t.contains(&format!("fsmonitor=touch {}", marker.display())),
            "{t}"
        );
        assert_eq!(
            tree_snapshot(&w),
            before,
            "{profile}: the host tree changed: {t}"
        );
        git_ok(&w, &["status", "--short"]);
        assert!(!marker.exists(), "{profile}: host git ran the agent's code");
        let id = layer_id(&t);
        let diff = |args: &[&str]| {
            let mut c = sandmux(&[&["diff", id.as_str()], args].concat());
            c.env("XDG_STATE_HOME", &state).current_dir(&w);
            c.output().unwrap()
        };
        let names = diff(&["--names-only"]);
        assert_eq!(names.status.code(), Some(1), "{}", text(&names));
        let n = String::from_utf8_lossy(&names.stdout);
        for line in [
            "M README",
            "D gone.txt",
            "A new.txt (file)",
            "A src/main.rs (file)",
            "H .git/config (held back: version-control data)",
            "H .envrc (held back: tool configuration)",
            "H sub/.git (held back: version-control data)",
        ] {
            assert!(
                n.lines().any(|l| l == line),
                "{profile}: {line:?} not in\n{n}"
            );
        }
        // The text, through patch: the work arrives, the control does not.
        let full = diff(&[]);
        let mut p = Command::new("patch")
            .args(["-p1", "-s"])
            .current_dir(&w)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(p.stdin.as_mut().unwrap(), &full.stdout).unwrap();
        assert!(
            p.wait().unwrap().success(),
            "{}",
            String::from_utf8_lossy(&full.stdout)
        );
        assert_eq!(
            std::fs::read_to_string(w.join("README")).unwrap(),
            "hello\nchanged\n"
        );
        assert!(!w.join("gone.txt").exists() && w.join("src/main.rs").exists());
        assert!(!w.join(".envrc").exists() && !w.join("sub").exists());
        git_ok(&w, &["status", "--short"]);
        assert!(!marker.exists(), "{profile}: the diff carried control");
        let mut d = sandmux(&["discard", &id]);
        let gone = d.env("XDG_STATE_HOME", &state).output().unwrap();
        assert!(gone.status.success(), "{}", text(&gone));
        assert_eq!(diff(&[]).status.code(), Some(2));
    }
    // Control: live, unguarded, the same script reaches host git.
    let open = profile_file(cfg.path(), "open", "default", unguard);
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join("gone.txt"), "bye\n");
    let host = host_dir();
    let marker = host.path().join("MARKER");
    let o = run_in(
        &w,
        open.to_str().unwrap(),
        &host.path().join("state"),
        &cow_script(&marker),
    );
    assert!(text(&o).contains("done"), "{}", text(&o));
    git_ok(&w, &["status", "--short"]);
    assert!(
        marker.exists(),
        "control: host git did not run the planted fsmonitor"
    );
}

/// The door (`sandmux apply ID`): the work comes in, control does not; a
/// host file changed since the instance started is a conflict (exit 3) that
/// keeps the human's bytes; a second apply finishes what is left and skips
/// what is done; PATHS limits it; `--include-control` with a named path
/// brings a held-back one; links stay out; a set-ID file the agent changed
/// comes in without its bit; `--undo` puts every replaced and removed
/// file back.
#[test]
fn apply_brings_the_work_in_and_nothing_else() {
    use std::os::unix::fs::PermissionsExt;
    let file = std::path::PathBuf::from("default");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    for (f, t) in [
        ("gone.txt", "bye\n"),
        ("human.txt", "mine\n"),
        ("tool", "#!/bin/sh\n"),
    ] {
        put(&w.join(f), t);
    }
    std::fs::set_permissions(w.join("tool"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let host = host_dir();
    let marker = host.path().join("MARKER");
    let state = host.path().join("state");
    let script = format!(
        "echo changed >> README && rm gone.txt && echo new > new.txt && chmod +x new.txt && mkdir d && echo e > d/e \
         && echo agent >> human.txt && echo 'echo hi' >> tool && ln -s /etc/passwd link \
         && git config core.fsmonitor 'touch {m}' && echo 'touch {m}' > .envrc && echo done",
        m = marker.display()
    );
    // Changes within 20 ms before the layer is made count as conflicts
    // (ctime is coarse): the human's setup is older than that.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = run_cow(&w, file.to_str().unwrap(), &state, &script);
    let t = text(&o);
    assert!(t.contains("done"), "{t}");
    let id = layer_id(&t);
    let apply = |args: &[&str]| {
        let mut c = sandmux(&[&["apply", id.as_str()], args].concat());
        c.env("XDG_STATE_HOME", &state);
        let o = c.output().unwrap();
        // The last line is the digest of what the apply weighed.
        let out = String::from_utf8_lossy(&o.stdout);
        let kept: Vec<&str> = out.lines().filter(|l| !l.starts_with("digest ")).collect();
        (o.status.code(), kept.join("\n"))
    };
    // A layer whose instance still runs is refused (its agent may write it).
    let mut live = run_cow_cmd(&w, file.to_str().unwrap(), &state, "echo x > y && sleep 30")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let layers = state.join("sandmux/layers");
    let mut other = String::new();
    wait_for(
        || {
            other = std::fs::read_dir(&layers)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // A layer being made is `.new-ID` until it is whole.
                .find(|n| *n != id && !n.starts_with('.'))
                .unwrap_or_default();
            !other.is_empty()
        },
        std::time::Duration::from_secs(10),
        "the second instance's layer",
    );
    let mut c = sandmux(&["apply", &other]);
    let busy = c.env("XDG_STATE_HOME", &state).output().unwrap();
    assert_eq!(busy.status.code(), Some(2), "{}", text(&busy));
    assert!(text(&busy).contains("is still running"), "{}", text(&busy));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(live.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = live.wait();
    // The human edits a file the agent changed too, after the instance.
    put(&w.join("human.txt"), "mine, edited\n");
    let (code, out) = apply(&["README", "d"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "applied README",
            "applied d",
            "applied d/e",
            &format!("kept 1 of your files, replaced or removed, in the layer until you discard it: `sandmux apply {id} --undo` puts them back"),
        ]
    );
    assert!(
        w.join("gone.txt").exists(),
        "PATHS limited the apply: {out}"
    );
    let (code, out) = apply(&[]);
    assert_eq!(code, Some(3), "{out}");
    for line in [
        "applied gone.txt",
        "applied new.txt",
        "applied tool",
        "conflict human.txt (changed on the host since the instance started)",
        "held back link (a symbolic link)",
        "held back .git/ (version-control data",
        "held back .envrc (tool configuration)",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "{line:?} not in\n{out}"
        );
    }
    assert!(!out.contains("README"), "done paths are skipped: {out}");
    assert_eq!(
        std::fs::read_to_string(w.join("human.txt")).unwrap(),
        "mine, edited\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("README")).unwrap(),
        "hello\nchanged\n"
    );
    assert!(!w.join("gone.txt").exists() && !w.join("link").exists() && !w.join(".envrc").exists());
    let mode = |p: &str| std::fs::metadata(w.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("new.txt"), 0o755);
    assert_eq!(mode("tool"), 0o755, "the set-ID bit is never carried");
    git_ok(&w, &["status", "--short"]);
    assert!(!marker.exists(), "apply carried control");
    // Control on request: a held-back path named with --include-control.
    let (code, out) = apply(&["--include-control", ".envrc"]);
    assert_eq!((code, out.trim()), (Some(0), "applied .envrc"));
    // Undo: every step back, newest first.
    let (code, out) = apply(&["--undo"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        std::fs::read_to_string(w.join("README")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("gone.txt")).unwrap(),
        "bye\n"
    );
    assert!(!w.join("new.txt").exists() && !w.join("d").exists() && !w.join(".envrc").exists());
    assert_eq!(
        mode("tool"),
        0o4755,
        "the human's own file is back as it was"
    );
}

/// What a reader of the diff could misread stays out of it and out of
/// `apply` (from the attack review): a directory whose name carries a
/// whole patch for `.git/config` after a newline, a `.envrc` followed by a
/// tab (where `patch` ends a name), a repository split over two
/// directories (`HEAD` + `commondir`), a lone carriage return, and a path
/// too long to open, which must not hide the rest. Host git runs nothing,
/// through `patch` or through `apply`.
#[test]
fn the_door_holds_back_what_a_reader_could_misread() {
    let file = std::path::PathBuf::from("default");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    let host = host_dir();
    let marker = host.path().join("MARKER");
    let state = host.path().join("state");
    let config = std::fs::read_to_string(w.join(".git/config")).unwrap();
    let tail: Vec<&str> = config.lines().rev().take(3).collect();
    let probe = format!(
        r#"import os
ctx = {ctx:?}
os.mkdir('zz\n--- "a\\057.git\\057config"\n+++ "b\\057.git\\057config"\n@@ -{n},3 +{n},5 @@\n' + ''.join(' ' + l + '\n' for l in ctx) + '+[core]\n+\tfsmonitor = "touch PWNED; false"\n')
open('.envrc\tjunk', 'w').write('touch {m}\n')
os.makedirs('tools/cache'); os.makedirs('lib/data/objects'); os.makedirs('lib/data/refs')
open('tools/cache/HEAD', 'w').write('ref: refs/heads/main\n')
open('tools/cache/commondir', 'w').write('../../lib/data\n')
open('lib/data/config', 'w').write('[core]\n\tpager = touch {m}\n')
open('cr.txt', 'w').write('a\rb\n')
top = os.getcwd()
for i in range(20):
    os.mkdir('x' * 250)
    os.chdir('x' * 250)
open('deep', 'w').write('d')
os.chdir(top)
open('ok.txt', 'w').write('work\n')
print('planted')
"#,
        ctx = tail.iter().rev().collect::<Vec<_>>(),
        n = config.lines().count() - 2,
        m = marker.display()
    );
    let o = run_cow(
        &w,
        file.to_str().unwrap(),
        &state,
        &format!("cat > /tmp/p.py <<'EOF'\n{probe}\nEOF\npython3 /tmp/p.py"),
    );
    let t = text(&o);
    assert!(t.contains("planted"), "{t}");
    let id = layer_id(&t);
    let door = |args: &[&str]| {
        let mut c = sandmux(args);
        c.env("XDG_STATE_HOME", &state).current_dir(&w);
        c.output().unwrap()
    };
    let d = door(&["diff", &id]);
    assert_eq!(d.status.code(), Some(1), "{}", text(&d));
    let out = String::from_utf8_lossy(&d.stdout).into_owned();
    for want in [
        "(held back: a name with control characters, quotes or backslashes, or not UTF-8)",
        "H tools/cache/HEAD (held back: a directory git could take for a repository)",
        "held back: the layer could not be read here",
        "A ok.txt (file)",
        "Binary or large files a/cr.txt and b/cr.txt differ",
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
    assert!(out.lines().all(|l| !l.starts_with("--- \"a")), "{out}");
    let mut p = Command::new("patch")
        .args(["-p1", "-s", "-f"])
        .current_dir(&w)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(p.stdin.as_mut().unwrap(), &d.stdout).unwrap();
    let _ = p.wait();
    assert_eq!(
        std::fs::read_to_string(w.join(".git/config")).unwrap(),
        config
    );
    assert!(w.join("ok.txt").exists() && !w.join(".envrc").exists() && !w.join("tools").exists());
    std::fs::remove_file(w.join("ok.txt")).unwrap();
    let a = door(&["apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", text(&a));
    assert_eq!(
        std::fs::read_to_string(w.join(".git/config")).unwrap(),
        config
    );
    assert!(
        w.join("ok.txt").exists()
            && !w.join(".envrc").exists()
            && !w.join("tools/cache/HEAD").exists()
    );
    git_ok(&w, &["status", "--short"]);
    git_ok(&w.join("lib"), &["status", "--short"]);
    assert!(
        !marker.exists() && !w.join("PWNED").exists() && !w.join("lib/PWNED").exists(),
        "host git ran the agent's code"
    );
    // Control: the same name printed raw (as the first diff did) is a patch
    // that `patch -p1` applies to `.git/config`, and host git then runs it.
    let raw = std::fs::read_dir(state.join("sandmux/layers").join(&id).join("upper"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("zz"))
        .unwrap();
    let cw = Ws::new();
    let c = cw.path();
    repo(&c);
    std::fs::copy(w.join(".git/config"), c.join(".git/config")).unwrap();
    let mut p = Command::new("patch")
        .args(["-p1", "-s", "-f"])
        .current_dir(&c)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let payload = format!("A {raw} (directory)\n");
    std::io::Write::write_all(p.stdin.as_mut().unwrap(), payload.as_bytes()).unwrap();
    let _ = p.wait();
    git_ok(&c, &["status", "--short"]);
    assert!(
        c.join("PWNED").exists(),
        "control: the raw name did not patch .git/config"
    );
}

/// The door leaves what the human has (from the second attack review): a
/// directory the agent removed goes only if nothing below it changed on the
/// host and it holds no repository; Sapling's directory and a name with a
/// bidirectional control are held back; `--undo` goes through no link the
/// human (or anyone) put in the workspace since, and leaves a file the human
/// changed after `apply`.
#[test]
fn apply_and_undo_leave_what_the_human_has() {
    let file = std::path::PathBuf::from("default");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    put(&w.join("sub/f"), "precious\n");
    put(&w.join("keep/x"), "mine\n");
    git_ok(&w, &["init", "-q", "nested"]);
    put(&w.join("a.txt"), "a\n");
    let host = host_dir();
    let state = host.path().join("state");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = "rm -rf nested keep && echo agent > sub/g && echo new >> a.txt && mkdir d && echo x > d/new \
                  && mkdir .sl && echo '[hooks]' > .sl/config \
                  && python3 -c 'open(\"\\u202etxt.exe\", \"w\").write(\"x\")' && echo done";
    let o = run_cow(&w, file.to_str().unwrap(), &state, script);
    let t = text(&o);
    assert!(t.contains("done"), "{t}");
    let id = layer_id(&t);
    put(&w.join("keep/x"), "mine, edited after the instance\n");
    let door = |args: &[&str]| {
        let mut c = sandmux(args);
        let o = c.env("XDG_STATE_HOME", &state).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = door(&["apply", &id]);
    assert_eq!(code, Some(3), "{out}");
    for line in [
        "applied a.txt",
        "applied d",
        "applied d/new",
        "applied sub/g",
        "held back .sl/ (version-control data",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "{line:?} not in\n{out}"
        );
    }
    assert!(
        out.contains("conflict nested (it holds a repository"),
        "{out}"
    );
    assert!(
        out.contains("conflict keep (keep/x changed on the host"),
        "{out}"
    );
    assert!(
        out.contains("txt.exe (a name with control characters"),
        "{out}"
    );
    assert!(w.join("nested/.git").is_dir() && w.join("keep/x").exists());
    // After apply: the human edits a.txt and puts a link where d was.
    put(&w.join("a.txt"), "the human's, after apply\n");
    let outside = host_dir();
    std::fs::rename(w.join("d"), w.join("d.real")).unwrap();
    std::os::unix::fs::symlink(outside.path(), w.join("d")).unwrap();
    put(&outside.path().join("new"), "outside\n");
    let (code, out) = door(&["apply", &id, "--undo"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("not undone: a.txt: changed since apply"),
        "{out}"
    );
    assert!(!w.join("sub/g").exists(), "sub/g was undone: {out}");
    assert_eq!(
        std::fs::read_to_string(w.join("a.txt")).unwrap(),
        "the human's, after apply\n"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("new")).unwrap(),
        "outside\n",
        "undo went through the link: {out}"
    );
    // Control: the link does lead outside (a path-based undo would follow it).
    assert!(w.join("d/new").exists());
}

/// Files the existing repository's configuration names inside the tree
/// (a hooks path, a clean filter, an included config) are control: `apply`
/// holds them back, and host git (`status`, `add`, `commit`) runs nothing of
/// the agent's. Control: the same paths brought in with
/// `--include-control` make host git run the agent's code.
#[test]
fn files_the_repositorys_configuration_names_are_held_back() {
    let file = std::path::PathBuf::from("default");
    let ws = Ws::new();
    let w = ws.path();
    repo(&w);
    git_ok(&w, &["config", "core.hooksPath", "hooks"]);
    git_ok(&w, &["config", "filter.x.clean", "./tools/clean"]);
    git_ok(&w, &["config", "include.path", "../gitinc"]);
    put(&w.join(".gitattributes"), "*.dat filter=x\n");
    put(&w.join("hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    put(&w.join("tools/clean"), "#!/bin/sh\ncat\n");
    put(&w.join("gitinc"), "[user]\n\tname = h\n");
    for f in ["hooks/pre-commit", "tools/clean"] {
        let mut p = std::fs::metadata(w.join(f)).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
        std::fs::set_permissions(w.join(f), p).unwrap();
    }
    git_ok(&w, &["add", "-A"]);
    git_ok(&w, &["commit", "-q", "-m", "tools"]);
    let host = host_dir();
    let state = host.path().join("state");
    let marker = host.path().join("MARKER");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let script = format!(
        "printf '#!/bin/sh\\ntouch {m}-hook\\n' > hooks/pre-commit && printf '#!/bin/sh\\ntouch {m}-filter; cat\\n' > tools/clean \
         && printf '[core]\\n\\tfsmonitor = \"touch {m}-include; false\"\\n' >> gitinc && echo data > x.dat && echo done",
        m = marker.display()
    );
    let o = run_cow(&w, file.to_str().unwrap(), &state, &script);
    assert!(text(&o).contains("done"), "{}", text(&o));
    let id = layer_id(&text(&o));
    let apply = |args: &[&str]| {
        let mut c = sandmux(&[&["apply", id.as_str()], args].concat());
        let o = c.env("XDG_STATE_HOME", &state).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = apply(&[]);
    assert_eq!(code, Some(0), "{out}");
    for line in [
        "applied x.dat",
        "held back gitinc (named by the repository's configuration (include.path))",
        "held back hooks/pre-commit (named by the repository's configuration (core.hookspath))",
        "held back tools/clean (named by the repository's configuration (filter.x.clean))",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "{line:?} not in\n{out}"
        );
    }
    let marks = || {
        ["hook", "filter", "include"]
            .iter()
            .filter(|k| host.path().join(format!("MARKER-{k}")).exists())
            .count()
    };
    git_ok(&w, &["status", "--short"]);
    git_ok(&w, &["add", "-A"]);
    git_ok(&w, &["commit", "-q", "-m", "x"]);
    assert_eq!(marks(), 0, "host git ran the agent's code");
    // Control: brought in on request, host git runs all three.
    let (code, out) = apply(&["--include-control", "hooks", "tools", "gitinc"]);
    assert_eq!(code, Some(0), "{out}");
    put(&w.join("x.dat"), "more\n");
    git_ok(&w, &["status", "--short"]);
    git_ok(&w, &["add", "-A"]);
    git_ok(&w, &["commit", "-q", "-m", "y"]);
    assert_eq!(marks(), 3, "control: {out}");
}

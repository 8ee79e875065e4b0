//! A property of the door, through the real binary: for any host tree and
//! any sequence of instances, each making random file operations (writes,
//! removals, renames, directories, mode changes, links to outside, hard
//! links) and each applied (whole or by PATHS), `apply` never writes
//! outside the workspace and never through a link, and `apply --undo` of
//! every layer, newest first, gives back the human's tree byte for byte.

use crate::common::*;
use crate::props::check;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const NAMES: [&str; 6] = ["a", "b", "d/a", "d/b", "e/f/g", "lnk/x"];

#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8),
    Remove(usize),
    Move(usize, usize),
    Chmod(usize),
    LinkOut(usize),
    Hard(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0..NAMES.len();
    prop_oneof![
        (n.clone(), any::<u8>()).prop_map(|(i, c)| Op::Write(i, c)),
        n.clone().prop_map(Op::Remove),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Move(a, b)),
        n.clone().prop_map(Op::Chmod),
        n.clone().prop_map(Op::LinkOut),
        (n.clone(), n).prop_map(|(a, b)| Op::Hard(a, b)),
    ]
}

fn script(ops: &[Op], outside: &Path) -> String {
    let mut s = String::from("set +e\n");
    for o in ops {
        s.push_str(&match o {
            Op::Write(i, c) => format!(
                "mkdir -p \"$(dirname {n})\"; printf 'v%s\\n' {c} > {n}\n",
                n = NAMES[*i]
            ),
            Op::Remove(i) => format!("rm -rf {}\n", NAMES[*i]),
            Op::Move(a, b) => format!(
                "mkdir -p \"$(dirname {})\"; mv {} {}\n",
                NAMES[*b], NAMES[*a], NAMES[*b]
            ),
            Op::Chmod(i) => format!("chmod 755 {}\n", NAMES[*i]),
            Op::LinkOut(i) => format!(
                "mkdir -p \"$(dirname {n})\"; rm -rf {n}; ln -s {o} {n}\n",
                n = NAMES[*i],
                o = outside.display()
            ),
            Op::Hard(a, b) => format!("ln {} {}\n", NAMES[*a], NAMES[*b]),
        });
    }
    s.push_str("true\n");
    s
}

/// Every entry below `root`: kind, permission bits, bytes or link target.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = p.symlink_metadata().unwrap();
            let v = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", m.permissions().mode() & 0o7777)
            } else {
                let b = std::fs::read(&p).unwrap();
                format!(
                    "file {:o} {}",
                    m.permissions().mode() & 0o7777,
                    String::from_utf8_lossy(&b)
                )
            };
            out.insert(rel, v);
        }
    }
    out
}

#[test]
fn apply_stays_inside_and_undo_gives_back_the_humans_tree() {
    let host_tree = proptest::collection::vec((0..5usize, any::<u8>()), 0..4);
    let layers = proptest::collection::vec(
        (
            proptest::collection::vec(op(), 1..6),
            proptest::option::of(0..NAMES.len()),
        ),
        1..3,
    );
    check(
        "door apply/undo",
        10,
        (host_tree, layers),
        |(host, layers)| {
            let outside = tempfile::Builder::new()
                .prefix("sandmux-prop-out-")
                .tempdir_in("/var/tmp")
                .unwrap();
            std::fs::write(outside.path().join("keep"), "outside\n").unwrap();
            let state = host_dir();
            let ws = Ws::new();
            let w = ws.path();
            for (i, c) in &host {
                let p = w.join(NAMES[*i]);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                let _ = std::fs::write(&p, format!("human {c}\n"));
            }
            // The human's own link to outside: never written through.
            std::os::unix::fs::symlink(outside.path(), w.join("lnk")).unwrap();
            let before = snapshot(&w);
            let out_before = snapshot(outside.path());
            let mut ids = Vec::new();
            for (ops, only) in &layers {
                std::thread::sleep(std::time::Duration::from_millis(30));
                let o = run(&w)
                    .state(state.path())
                    .flag("--on-end", "keep")
                    .script(&script(ops, outside.path()))
                    .output();
                prop_assert!(o.status.success(), "{}", o);
                let Some(id) = o
                    .stderr()
                    .split("sandmux diff ")
                    .nth(1)
                    .and_then(|s| s.split('`').next())
                    .map(str::to_string)
                else {
                    continue; // nothing changed: no layer
                };
                let mut args = vec!["apply".to_string(), id.clone()];
                args.extend(only.map(|i| NAMES[i].split('/').next().unwrap().to_string()));
                let a = ran(
                    sandmux(&args.iter().map(String::as_str).collect::<Vec<_>>())
                        .env("XDG_STATE_HOME", state.path()),
                );
                prop_assert!(matches!(a.status.code(), Some(0 | 1 | 3)), "{}", a);
                prop_assert_eq!(
                    &snapshot(outside.path()),
                    &out_before,
                    "written outside: {}",
                    a
                );
                ids.push(id);
            }
            for id in ids.iter().rev() {
                let u = ran(sandmux(&["apply", id, "--undo"]).env("XDG_STATE_HOME", state.path()));
                prop_assert!(u.status.success(), "{}", u);
            }
            prop_assert_eq!(snapshot(&w), before);
            prop_assert_eq!(snapshot(outside.path()), out_before);
            Ok(())
        },
    );
}

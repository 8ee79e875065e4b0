//! The door at scale, under a race, and on the record: a huge layer comes
//! in whole; a layer whose directories are swapped for links to outside
//! while `apply` runs writes nothing outside the workspace; every door
//! action is a record in the instance's audit log, sealed again after it.

use crate::common;
use crate::workspace_env;
use common::*;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use workspace_env::*;

/// A layer of 20,000 files in 100 directories and a 64 MiB file: `apply`
/// brings every one in, with its content, and leaves no temporary file;
/// the audit log (named after the instance, as `ps` names it) has the
/// door's record, counted, and its seal; `discard` adds a second.
#[test]
fn a_huge_layer_comes_in_whole_and_on_the_record() {
    let ws = Ws::new();
    let w = ws.path();
    let host = host_dir();
    let state = host.path();
    let o = run_cow(
        &w,
        "default",
        state,
        "for d in $(seq 0 99); do mkdir d$d && (cd d$d && seq 1 200 | split -l 1 -a 3 - f); done; \
         head -c 67108864 /dev/urandom > big; sha256sum big > big.sum; echo done",
    );
    assert!(text(&o).contains("done"), "{}", text(&o));
    let id = layer_id(&text(&o));
    assert!(
        !w.join("big").exists(),
        "the host tree changed while it ran"
    );
    let a = door(state, &["apply", &id]);
    assert_eq!(a.status.code(), Some(0), "{}", text(&a));
    let mut n = 0;
    for d in 0..100 {
        let names = std::fs::read_dir(w.join(format!("d{d}"))).unwrap();
        for e in names.flatten() {
            let t = std::fs::read_to_string(e.path()).unwrap();
            assert!(t.ends_with('\n') && t.len() <= 4, "{:?}: {t:?}", e.path());
            n += 1;
        }
    }
    assert_eq!(n, 20_000);
    let sum = std::process::Command::new("sha256sum")
        .args(["-c", "big.sum"])
        .current_dir(&w)
        .output()
        .unwrap();
    assert!(sum.status.success(), "{}", text(&sum));
    let recs = door_records(state, &id);
    let rec = recs
        .iter()
        .find(|r| r["tool"] == "(door)" && r["error_type"] == "apply")
        .unwrap_or_else(|| panic!("no door record: {recs:?}"));
    assert_eq!(rec["args"]["applied_count"], 20_000 + 100 + 2, "{rec}");
    assert_eq!(rec["args"]["instance"], id.as_str());
    assert_eq!(rec["args"]["exit_status"], 0);
    assert_eq!(recs.last().unwrap()["tool"], "(sealed)");
    let d = door(state, &["discard", &id]);
    assert!(d.status.success(), "{}", text(&d));
    let recs = door_records(state, &id);
    assert!(
        recs.iter().any(|r| r["error_type"] == "discard"),
        "{recs:?}"
    );
    assert_eq!(recs.last().unwrap()["tool"], "(sealed)");
}

/// While `apply` works, a host process swaps the layer's directories and
/// the workspace's for links to a directory outside, again and again. No
/// file appears outside; whatever `apply` could not place safely is a
/// conflict or is left in the layer. Control: the same swap, followed by a
/// plain copy that follows links, does write outside.
#[test]
fn a_symlink_race_during_apply_writes_nothing_outside() {
    const DIRS: usize = 40;
    let ws = Ws::new();
    let w = ws.path();
    let host = host_dir();
    let state = host.path();
    let outside = host.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    for d in 0..DIRS {
        put(&w.join(format!("h{d}/keep")), "human\n");
    }
    let o = run_cow(
        &w,
        "default",
        state,
        &format!(
            "for d in $(seq 0 {}); do mkdir -p l$d h$d && (cd l$d && seq 1 100 | split -l 1 -a 3 - f) && \
             (cd h$d && seq 1 100 | split -l 1 -a 3 - f); done; echo done",
            DIRS - 1
        ),
    );
    assert!(text(&o).contains("done"), "{}", text(&o));
    let id = layer_id(&text(&o));
    let upper = state.join("sandmux/layers").join(&id).join("upper");
    let stop = AtomicBool::new(false);
    let swaps = std::sync::atomic::AtomicUsize::new(0);
    let swap = |root: &Path, d: &str| {
        let real = root.join(d);
        let aside = root.join(format!("{d}.aside"));
        if std::fs::rename(&real, &aside).is_ok() {
            let _ = std::os::unix::fs::symlink(&outside, &real);
            std::thread::yield_now();
            let _ = std::fs::remove_file(&real);
            let _ = std::fs::rename(&aside, &real);
            swaps.fetch_add(1, Ordering::Relaxed);
        }
    };
    let race = |body: &dyn Fn() -> Output| {
        stop.store(false, Ordering::Relaxed);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for d in 0..DIRS {
                        swap(&upper, &format!("l{d}"));
                        swap(&w, &format!("h{d}"));
                    }
                }
            });
            let out = body();
            stop.store(true, Ordering::Relaxed);
            out
        })
    };
    let a = race(&|| door(state, &["apply", &id]));
    assert!(
        matches!(a.status.code(), Some(0 | 3)),
        "apply under the race: {}",
        text(&a)
    );
    assert!(swaps.load(Ordering::Relaxed) > 10, "the race never ran");
    let written: Vec<_> = std::fs::read_dir(&outside).unwrap().flatten().collect();
    assert!(
        written.is_empty(),
        "apply wrote outside: {written:?}\n{}",
        text(&a)
    );
    for d in 0..DIRS {
        let keep = std::fs::read_to_string(w.join(format!("h{d}/keep")));
        assert_eq!(keep.ok().as_deref(), Some("human\n"), "h{d}/keep lost");
    }
    // Control: a copy by path name (as `cp -r` writes), under the same
    // race, lands outside.
    race(&|| {
        for _ in 0..2000 {
            for d in 0..DIRS {
                let _ = std::fs::write(w.join(format!("h{d}/naive")), "followed\n");
            }
            if std::fs::read_dir(&outside).unwrap().next().is_some() {
                break;
            }
        }
        door(state, &["--version"])
    });
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_some(),
        "the control never wrote through a swapped link"
    );
}

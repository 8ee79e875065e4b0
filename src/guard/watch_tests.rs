//! The watch's recheck, driven directly: a path no event reports is still
//! taken.

use super::*;
use crate::guard::GitMode;

/// No watch is in place (as when the user's inotify limit refused them),
/// so no event reports the planted `.envrc`: the recheck, on its deadline,
/// takes it. Control: a while after the plant, before the first recheck,
/// it is still there.
#[test]
fn a_path_no_event_reports_is_taken_by_the_recheck() {
    let t = tempfile::tempdir().unwrap();
    let ws = t.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let names = [PathBuf::from(".envrc")];
    let (guard, _) = super::super::plan(
        std::slice::from_ref(&ws),
        &names,
        GitMode::Unguarded,
        crate::profile::NewRepos::Allow,
    )
    .unwrap();
    let q = Quarantine::open(&t.path().join("state"), "recheck").unwrap();
    let taken = Arc::new(Mutex::new(Vec::new()));
    let mut armed = Armed::new(
        &guard,
        Vec::new(),
        Arc::new(Mutex::new(q)),
        taken.clone(),
        Arc::new(AtomicUsize::new(0)),
    )
    .unwrap();
    let (stop_r, stop_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    let started = Instant::now();
    let th = std::thread::spawn(move || armed.run(stop_r));
    std::fs::write(ws.join(".envrc"), "echo planted\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        started.elapsed() < RECHECK && ws.join(".envrc").exists(),
        "control: without a watch nothing takes it before the recheck"
    );
    while ws.join(".envrc").exists() && started.elapsed() < RECHECK * 3 {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stop_w);
    th.join().unwrap();
    assert!(!ws.join(".envrc").exists(), "the recheck did not take it");
    let t = lock(&taken);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].how, crate::guard::quarantine::How::Renamed, "{t:?}");
}

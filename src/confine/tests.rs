//! Unit tests of `confine` (the supervisor's confinement): what the confined proxy still reads.
use super::*;
use crate::profile::credentials::Credential;
use std::os::unix::fs::PermissionsExt;

fn write(p: &Path, v: &str) {
    if p.exists() {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(p, v).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o400)).unwrap();
}

/// What a thread confined with `needs` gets for the credential's
/// placeholder after each rotation `main` makes (unconfined), in order.
fn confined_reads(
    policy: &Policy,
    needs: &Needs,
    steps: &[&dyn Fn()],
) -> Vec<Result<String, (u16, String)>> {
    let vault = crate::proxy::credentials::Vault::open(&policy.credentials, &[])
        .unwrap()
        .unwrap();
    let ph = vault.inside_env()[0].1.clone();
    let prepared = prepare(policy, needs).unwrap();
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let (tell, told) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            crate::sandbox::caps::set_no_new_privs().unwrap();
            prepared.restrict().unwrap();
            while asked.recv().is_ok() {
                let r = vault.header("authorization", ph.as_bytes(), "api.test");
                let r = r.map(|v| String::from_utf8(v.unwrap()).unwrap());
                tell.send(r.map_err(|e| (e.code, e.why))).unwrap();
            }
        });
        let out = steps
            .iter()
            .map(|step| {
                step();
                ask.send(()).unwrap();
                told.recv().unwrap()
            })
            .collect();
        drop(ask);
        out
    })
}

/// A `from_file` rotated by a rename and by a rewrite in place is read
/// again by a thread under the rules `serve` (its supervisor) and `run`
/// (the proxy's thread) derive from the profile; the control swaps the
/// file for a link into a directory no rule covers: the old failure
/// (503, permission denied), though the host can read it.
#[test]
fn a_confined_proxy_reads_a_rotated_credential_file_again() {
    if effective_abi(None).1 < 1 {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (dir, other) = (d.path().join("secrets"), d.path().join("elsewhere"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&other).unwrap();
    let f = dir.join("tok");
    let mut policy = crate::sandbox::view::sample();
    policy.credentials = vec![Credential {
        name: "TOK".into(),
        send_to: vec!["api.test".into()],
        from_file: Some(f.clone()),
        ..Default::default()
    }];
    let rundir = tempfile::tempdir().unwrap();
    let files = Files {
        rundir: rundir.path(),
        host_view: None,
        tmux: Path::new("/usr/bin/tmux"),
        audit: Path::new("/dev/null"),
        record: None,
        cgroup: &[],
        guard: None,
        proxy: Dials::default(),
    };
    let serve = Needs::supervisor(&policy, &files);
    let run = proxy_thread_needs(&policy, Dials::default());
    for needs in [serve, run] {
        let _ = std::fs::remove_file(&f);
        write(&f, "first-secret-value");
        let renamed = || {
            write(&dir.join("new"), "second-secret-value");
            std::fs::rename(dir.join("new"), &f).unwrap();
        };
        let rewritten = || write(&f, "third-secret-value");
        let elsewhere = || {
            write(&other.join("tok"), "fourth-secret-value");
            std::fs::remove_file(&f).unwrap();
            std::os::unix::fs::symlink(other.join("tok"), &f).unwrap();
        };
        let got = confined_reads(&policy, &needs, &[&|| (), &renamed, &rewritten, &elsewhere]);
        assert_eq!(
            got[..3],
            [
                Ok("first-secret-value".into()),
                Ok("second-secret-value".into()),
                Ok("third-secret-value".into())
            ]
        );
        let Err((503, why)) = &got[3] else {
            panic!("{got:?}")
        };
        assert!(why.contains("Permission denied"), "{why}");
        let host = crate::secretfile::read(&f, "", (8, 64)).unwrap().0;
        assert_eq!(host, b"fourth-secret-value");
    }
}

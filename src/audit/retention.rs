//! Retention: each new `serve` removes the logs of finished instances from
//! the default audit directory once their last record is older than the
//! user's `[audit] keep_days` ([`crate::profile::user`]; 30 by default, 0
//! keeps every log). Only files named as `serve` names them
//! (`<seconds>-<12 hex>.jsonl`), only regular files (never through a link),
//! never a live instance's (a running `serve` holds a lock on its log), and
//! never a log given with `--audit-log`.

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Whether `name` is a log `serve` named.
fn named_by_serve(name: &str) -> bool {
    let Some((secs, id)) = name.strip_suffix(".jsonl").and_then(|s| s.split_once('-')) else {
        return false;
    };
    let hex = id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit());
    hex && !secs.is_empty() && secs.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a running `serve` holds the log (opened without following links).
fn held(d: &nix::dir::Dir, name: &str) -> bool {
    use nix::fcntl::{openat, Flock, FlockArg};
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let Ok(fd) = openat(d, name, flags, Mode::empty()) else {
        return true;
    };
    Flock::lock(std::fs::File::from(fd), FlockArg::LockExclusiveNonblock).is_err()
}

/// Removes the finished logs in `dir` whose last write is older than
/// `keep_days`. Returns how many it removed.
pub(crate) fn apply(
    dir: &Path,
    keep_days: u32,
    now: SystemTime,
) -> Result<usize, super::RetentionError> {
    if keep_days == 0 {
        return Ok(0);
    }
    let cutoff = now - Duration::from_secs(u64::from(keep_days) * 86_400);
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let d = match nix::dir::Dir::open(dir, flags, Mode::empty()) {
        Ok(d) => d,
        Err(nix::errno::Errno::ENOENT) => return Ok(0),
        Err(source) => {
            let dir = dir.to_path_buf();
            return Err(super::RetentionError { dir, source });
        }
    };
    let me = nix::unistd::geteuid().as_raw();
    let mut d = d;
    let names: Vec<String> = d
        .iter()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut old = Vec::new();
    for name in names {
        if !named_by_serve(&name) {
            continue;
        }
        let Ok(st) = fstatat(&d, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let regular = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
        if regular && st.st_uid == me && mtime < cutoff && !held(&d, &name) {
            old.push(name);
        }
    }
    let mut n = 0;
    for name in old {
        if nix::unistd::unlinkat(&d, name.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir).is_ok()
        {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_old_finished_logs_named_by_serve() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        for n in [
            "100-aaaaaaaaaaaa.jsonl",
            "100-bbbbbbbbbbbb.jsonl",
            "notes.jsonl",
            "100-cccccccccccc.jsonl.bak",
        ] {
            std::fs::write(p(n), "x\n").unwrap();
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("t"), "keep").unwrap();
        std::os::unix::fs::symlink(outside.path().join("t"), p("100-dddddddddddd.jsonl")).unwrap();
        let later = SystemTime::now() + Duration::from_secs(40 * 86_400);
        let f = std::fs::File::open(p("100-bbbbbbbbbbbb.jsonl")).unwrap();
        let _live = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock).unwrap();
        assert_eq!(apply(dir.path(), 30, SystemTime::now()).unwrap(), 0);
        assert_eq!(apply(dir.path(), 0, later).unwrap(), 0);
        let n = apply(dir.path(), 30, later).unwrap();
        assert_eq!(n, 1);
        assert!(!p("100-aaaaaaaaaaaa.jsonl").exists());
        for n in [
            "100-bbbbbbbbbbbb.jsonl",
            "notes.jsonl",
            "100-cccccccccccc.jsonl.bak",
        ] {
            assert!(p(n).exists(), "{n}");
        }
        assert!(p("100-dddddddddddd.jsonl").symlink_metadata().is_ok());
        assert_eq!(
            std::fs::read_to_string(outside.path().join("t")).unwrap(),
            "keep"
        );
    }
}

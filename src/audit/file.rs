//! The log file itself: a record's link in the hash chain, the room kept
//! for appends, and where an existing log's chain ends.

use super::GENESIS;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// No room kept for appends: the file system's error, or `ENOSPC` where
/// it cannot preallocate and too little is free.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.desc())]
pub(crate) struct NoRoom(nix::errno::Errno);

/// Why an existing log cannot be continued.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LastLinkError {
    /// Its last record is torn.
    #[error("audit log {}: it ends in a torn record (`sandmux audit verify` says more); move it aside or pass another --audit-log", path.display())]
    Torn { path: PathBuf },
    /// It could not be read.
    #[error("audit log {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A record's hash: the previous one's, then the record's body.
pub(super) fn hash_line(prev: &str, body: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(body.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Keeps `need` bytes after `at` allocated to the file (`fallocate` with
/// KEEP_SIZE), so appends into them cannot fail for want of space; where the
/// file system cannot preallocate, at least that much must be free.
pub(super) fn room(file: &std::fs::File, at: u64, need: u64) -> Result<(), NoRoom> {
    use nix::errno::Errno;
    use nix::fcntl::{fallocate, FallocateFlags};
    let (at, need) = (at as i64, need as i64);
    match fallocate(file.as_fd(), FallocateFlags::FALLOC_FL_KEEP_SIZE, at, need) {
        Ok(()) => Ok(()),
        Err(Errno::EOPNOTSUPP | Errno::ENOSYS) => {
            let s = nix::sys::statvfs::fstatvfs(file.as_fd()).map_err(NoRoom)?;
            let free = s.blocks_available() as u64 * s.fragment_size() as u64;
            if free >= need as u64 {
                Ok(())
            } else {
                Err(NoRoom(Errno::ENOSPC))
            }
        }
        Err(e) => Err(NoRoom(e)),
    }
}

/// The last record's seq and hash in an existing log (read through the
/// descriptor that will append). A torn last line is not continued.
pub(super) fn last_link(file: &std::fs::File, path: &Path) -> Result<(u64, String), LastLinkError> {
    use std::io::BufRead;
    let (mut seq, mut prev) = (0u64, GENESIS.to_string());
    let mut r = std::io::BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Ok((seq, prev)),
            Ok(_) if line.last() != Some(&b'\n') => {
                return Err(LastLinkError::Torn { path: path.into() })
            }
            Ok(_) => {
                if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                    seq = v["seq"].as_u64().unwrap_or(seq);
                    prev = v["hash"].as_str().unwrap_or(&prev).to_string();
                }
            }
            Err(source) => {
                return Err(LastLinkError::Read {
                    path: path.into(),
                    source,
                })
            }
        }
    }
}

//! The store's own files: the bytes its objects take, and a file written
//! new (0600, never through a link).

use super::HistoryError;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Bytes of the objects in `objects`.
pub(crate) fn objects_bytes(objects: &Path) -> u64 {
    std::fs::read_dir(objects)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Writes `text` to the new file `p` (0600).
pub(crate) fn write_new(p: &Path, text: &[u8]) -> Result<(), HistoryError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(|e| HistoryError::io("writing", p, e))?;
    f.write_all(text)
        .map_err(|e| HistoryError::io("writing", p, e))
}

//! A file's data without its holes: the agent chooses the sizes, and a
//! sparse file that costs it nothing in the layer must cost the host's disk
//! no more than its data when copied, and the human's `diff` no more than
//! its data when hashed. The data segments are found with `SEEK_DATA` and
//! `SEEK_HOLE` (a file system without them reports the whole file as data);
//! a copy sets the length last, so a trailing hole stays a hole.

use nix::unistd::{lseek, Whence};
use std::io::{Seek, SeekFrom};

/// Calls `each(start, end)` for every data segment of `f` (`len` bytes
/// long), in order.
pub(crate) fn segments(
    f: &std::fs::File,
    len: u64,
    mut each: impl FnMut(u64, u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let len = len as i64;
    let mut at = 0i64;
    while at < len {
        let data = match lseek(f, at, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::Error::ENXIO) => break, // only a hole is left
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(f, data, Whence::SeekHole).unwrap_or(len).min(len);
        if hole <= data {
            break;
        }
        each(data as u64, hole as u64)?;
        at = hole;
    }
    Ok(())
}

/// Copies `src` (its metadata `meta`) into the empty `dst`, holes kept: a
/// file with no hole (its blocks cover its length) is one copy from the
/// start, with no seek and no length set; otherwise segment by segment.
pub(crate) fn copy_of(
    src: &mut std::fs::File,
    meta: &std::fs::Metadata,
    dst: &mut std::fs::File,
) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let len = meta.len();
    if meta.blocks() * 512 >= len {
        return copy_whole(src, len, dst);
    }
    let reader = src.try_clone()?;
    segments(&reader, len, |start, end| {
        src.seek(SeekFrom::Start(start))?;
        dst.seek(SeekFrom::Start(start))?;
        let want = end - start;
        let n = std::io::copy(&mut std::io::Read::take(&mut *src, want), dst)?;
        if n != want {
            return Err(std::io::Error::other(
                "the layer's file shrank while it was copied",
            ));
        }
        Ok(())
    })?;
    dst.set_len(len)
}

/// The first `len` bytes of `src` into `dst`, in the kernel
/// (`copy_file_range`) where it can, else through a buffer.
fn copy_whole(src: &mut std::fs::File, len: u64, dst: &mut std::fs::File) -> std::io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let want = usize::try_from(len - done).unwrap_or(usize::MAX);
        match kernel_copy(src, dst, want) {
            Ok(0) => break,
            Ok(n) => done += n as u64,
            // Another file system, or none of it: a plain copy of the rest.
            Err(
                nix::Error::EXDEV
                | nix::Error::ENOSYS
                | nix::Error::EINVAL
                | nix::Error::EOPNOTSUPP,
            ) if done == 0 => {
                done = std::io::copy(&mut std::io::Read::take(&mut *src, len), dst)?;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if done != len {
        return Err(std::io::Error::other(
            "the layer's file shrank while it was copied",
        ));
    }
    Ok(())
}

/// One `copy_file_range` of up to `want` bytes, at both files' offsets.
fn kernel_copy(src: &std::fs::File, dst: &std::fs::File, want: usize) -> nix::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: two open descriptors, null offsets (each file's own is
    // used and advanced), no flags; the call reads and writes no memory of
    // this process.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            std::ptr::null_mut(),
            dst.as_raw_fd(),
            std::ptr::null_mut(),
            want,
            0,
        )
    };
    nix::errno::Errno::result(n).map(|n| n as usize)
}

/// The SHA-256 of a file's length and of each data segment with its offset
/// (a hole costs nothing to hash); hex. A file with no hole is one
/// segment, read without a seek.
pub(crate) fn digest(f: &std::fs::File) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::{FileExt, MetadataExt};
    let m = f.metadata()?;
    let len = m.len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    // No more than the file needs (most are small: a 64 KiB buffer zeroed
    // for each would cost more than reading them).
    let mut buf = vec![0u8; len.clamp(1, 64 << 10) as usize];
    let mut hash = |start: u64, end: u64| -> std::io::Result<()> {
        h.update(start.to_le_bytes());
        let mut at = start;
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            let n = f.read_at(&mut buf[..want], at)?;
            if n == 0 {
                return Err(std::io::Error::other("the file shrank while it was read"));
            }
            h.update(&buf[..n]);
            at += n as u64;
        }
        Ok(())
    };
    if m.blocks() * 512 >= len {
        if len > 0 {
            hash(0, len)?;
        }
    } else {
        segments(f, len, &mut hash)?;
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn holes_stay_holes_and_bytes_stay_bytes() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let mut f = std::fs::File::create(&a).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(64 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        f.set_len(128 << 20).unwrap();
        drop(f);
        let mut src = std::fs::File::open(&a).unwrap();
        let mut dst = std::fs::File::create(&b).unwrap();
        let meta = src.metadata().unwrap();
        copy_of(&mut src, &meta, &mut dst).unwrap();
        drop(dst);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let m = std::fs::metadata(&b).unwrap();
        assert_eq!(m.len(), 128 << 20);
        assert!(
            m.blocks() * 512 < 4 << 20,
            "{} bytes on disk",
            m.blocks() * 512
        );
        let t = std::time::Instant::now();
        let one = digest(&std::fs::File::open(&a).unwrap()).unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(one, digest(&std::fs::File::open(&b).unwrap()).unwrap());
        std::fs::write(&b, b"other").unwrap();
        assert_ne!(one, digest(&std::fs::File::open(&b).unwrap()).unwrap());
    }
}

//! Opening the workspace inside the sandbox so that no name the agent can
//! change redirects it (issue 43, review finding 1).
//!
//! The default profile makes `{home}` and `/tmp` writable: the agent can
//! rename any directory above the workspace's mount point (only the mount
//! point itself is busy) and plant a link, or a directory, in its place.
//! So the workspace is opened from the sandbox's `/` with `openat2`
//! refusing every link on the way (`RESOLVE_NO_SYMLINKS`,
//! `RESOLVE_NO_MAGICLINKS`), and what was opened must be *the* overlay:
//! the root of a mount (`STATX_ATTR_MOUNT_ROOT`) whose mount id is, in
//! the sandbox's own mount table (`/proc/PID/mountinfo`, opened by
//! [`super::spawn`] before anything of the agent's is read), the only
//! `overlay` mount of that namespace, mounted from its root, at the
//! workspace's path. Why that is enough: the sandbox mounts exactly one
//! overlay (the workspace, `sandbox::plan`), and nothing in the sandbox
//! can mount (no capability in the sandbox's namespaces, and mounts made
//! in a namespace of its own never show in this one). A directory or a
//! link planted at the path is no mount root; the real overlay moved
//! elsewhere is at another path; so the rewinder either opens the real
//! workspace or refuses before writing anything.

use super::merged::InsideError;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn refuse(why: String) -> InsideError {
    InsideError::Setup(format!(
        "{why}: the workspace's path inside the sandbox no longer names its copy-on-write overlay (a directory above it was renamed or replaced from a pane?); nothing was written: `sandmux stop ID`, then `sandmux rewind ID N` rewinds the kept layer"
    ))
}

/// The workspace at `workspace` inside the joined mount namespace, checked
/// against that namespace's mount table (`mountinfo`).
pub(crate) fn open(workspace: &Path, mountinfo: OwnedFd) -> Result<OwnedFd, InsideError> {
    let root = crate::sandbox::beneath::open_root(Path::new("/"))
        .map_err(|e| refuse(format!("opening the sandbox's /: {e}")))?;
    let rel = workspace.strip_prefix("/").unwrap_or(workspace);
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY;
    let ws = crate::sandbox::beneath::beneath(&root, rel, flags).map_err(|e| {
        refuse(format!(
            "opening {} with no link followed: {e}",
            crate::term::printable(&workspace.to_string_lossy())
        ))
    })?;
    let (mnt_id, is_root) = mount_of(&ws).map_err(|e| refuse(format!("statx: {e}")))?;
    if !is_root {
        return Err(refuse("what is there is not a mount's root".into()));
    }
    let mut text = Vec::new();
    std::fs::File::from(mountinfo)
        .read_to_end(&mut text)
        .map_err(|e| refuse(format!("reading the sandbox's mount table: {e}")))?;
    check_table(&text, mnt_id, workspace.as_os_str().as_bytes()).map_err(refuse)?;
    Ok(ws)
}

/// The mount id of `fd` and whether it is that mount's root.
fn mount_of(fd: &OwnedFd) -> std::io::Result<(u64, bool)> {
    // SAFETY: a zeroed statx (plain integers) is a valid buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, a C string and a buffer we own.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            &mut st,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let attr = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_mask & libc::STATX_MNT_ID == 0 || st.stx_attributes_mask & attr == 0 {
        return Err(std::io::Error::other(
            "the kernel reports no mount id or mount root (Linux 5.8 or later is needed)",
        ));
    }
    Ok((st.stx_mnt_id, st.stx_attributes & attr != 0))
}

/// `mountinfo`'s `\ooo` escapes undone.
fn unescape(f: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(f.len());
    let mut i = 0;
    while i < f.len() {
        let oct = f
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (f[i], oct) {
            (b'\\', Some(o)) => {
                out.push(o.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Whether the mount table holds exactly one overlay, mount `id`, mounted
/// from its root at `path`; why not.
pub(crate) fn check_table(text: &[u8], id: u64, path: &[u8]) -> Result<(), String> {
    let mut overlays = Vec::new();
    for line in text.split(|c| *c == b'\n').filter(|l| !l.is_empty()) {
        let f: Vec<&[u8]> = line.split(|c| *c == b' ').collect();
        let Some(dash) = f.iter().position(|x| *x == b"-") else {
            return Err("the sandbox's mount table is not in the kernel's format".into());
        };
        if f.get(dash + 1) == Some(&&b"overlay"[..]) && dash >= 5 {
            overlays.push((f[0], f[3], f[4]));
        }
    }
    let want = id.to_string();
    match overlays.as_slice() {
        [(i, root, at)] if *i == want.as_bytes() && *root == b"/" && unescape(at) == path => Ok(()),
        [_] => Err(
            "the directory there is not the sandbox's overlay, mounted at the workspace's path"
                .into(),
        ),
        o => Err(format!(
            "the sandbox's mount namespace holds {} overlay mounts, not one",
            o.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::check_table;

    const TABLE: &[u8] = b"20 1 0:5 / / rw - tmpfs tmpfs rw\n\
31 20 0:40 / /tmp/w\\040x/code/proj rw,nosuid - overlay overlay rw,upperdir=/proc/self/fd/9\n\
32 20 0:41 / /tmp rw - tmpfs tmpfs rw\n";

    #[test]
    fn the_one_overlay_at_the_workspace_path_is_accepted_and_nothing_else() {
        assert!(check_table(TABLE, 31, b"/tmp/w x/code/proj").is_ok());
        // Moved elsewhere by a renamed parent: another path.
        assert!(check_table(TABLE, 31, b"/tmp/w x.moved/code/proj").is_err());
        // Another mount at the path.
        assert!(check_table(TABLE, 32, b"/tmp/w x/code/proj").is_err());
        let two = [TABLE, b"33 20 0:42 / /o rw - overlay overlay rw\n"].concat();
        assert!(check_table(&two, 31, b"/tmp/w x/code/proj").is_err());
        let sub = String::from_utf8_lossy(TABLE).replace("0:40 / ", "0:40 /sub ");
        assert!(check_table(sub.as_bytes(), 31, b"/tmp/w x/code/proj").is_err());
    }
}

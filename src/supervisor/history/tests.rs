//! The history's property: after any sequence of file operations, each
//! followed by a checkpoint, rewinding to any checkpoint N gives exactly
//! the tree as it was after N, and rewinding to the checkpoint a rewind
//! took first gives back the tree as it was before the rewind, and that
//! writing checkpoint N out whole (`--upto N`) gives that tree too.

use super::rewind::rewind;
use super::store::History;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[derive(Debug, Clone)]
enum Op {
    Write(u8, u8),
    Append(u8),
    Remove(u8),
    Rename(u8, u8),
    Mkdir(u8),
    Chmod(u8, bool),
    Link(u8, u8),
    Hardlink(u8, u8),
}

const NAMES: [&str; 6] = ["a", "b", "d/c", "d/e", "d/f/g", "h"];

fn name(i: u8) -> &'static str {
    NAMES[i as usize % NAMES.len()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Write(a, b)),
        any::<u8>().prop_map(Op::Append),
        any::<u8>().prop_map(Op::Remove),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Rename(a, b)),
        any::<u8>().prop_map(Op::Mkdir),
        (any::<u8>(), any::<bool>()).prop_map(|(a, b)| Op::Chmod(a, b)),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Link(a, b)),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Hardlink(a, b)),
    ]
}

/// Does `op` in `root`, ignoring what the tree makes impossible (a file
/// where a directory should be): like an agent's commands, some fail.
fn run(root: &Path, op: &Op) {
    let p = |i: u8| root.join(name(i));
    let parent = |i: u8| {
        let _ = std::fs::create_dir_all(p(i).parent().unwrap());
    };
    match op {
        Op::Write(i, b) => {
            parent(*i);
            let _ = std::fs::write(p(*i), vec![*b; *b as usize % 7]);
        }
        Op::Append(i) => {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(p(*i)) {
                let _ = f.write_all(b"more\n");
            }
        }
        Op::Remove(i) => {
            let _ = std::fs::remove_file(p(*i)).or_else(|_| std::fs::remove_dir_all(p(*i)));
        }
        Op::Rename(i, j) => {
            parent(*j);
            let _ = std::fs::rename(p(*i), p(*j));
        }
        Op::Mkdir(i) => {
            let _ = std::fs::create_dir_all(p(*i));
        }
        Op::Chmod(i, x) => {
            let mode = if *x { 0o755 } else { 0o640 };
            let _ = std::fs::set_permissions(p(*i), std::fs::Permissions::from_mode(mode));
        }
        Op::Link(i, j) => {
            parent(*i);
            let _ = std::os::unix::fs::symlink(format!("../{}", name(*j)), p(*i));
        }
        Op::Hardlink(i, j) => {
            parent(*j);
            let _ = std::fs::hard_link(p(*i), p(*j));
        }
    }
}

/// The tree: kind, mode and content of every entry (links by target).
fn tree(root: &Path) -> BTreeMap<String, (String, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let mode = m.permissions().mode() & 0o777;
            let v = if m.file_type().is_symlink() {
                let t = std::fs::read_link(&path).unwrap();
                ("link".into(), 0, t.display().to_string().into_bytes())
            } else if m.is_dir() {
                stack.push(path);
                ("dir".into(), mode, vec![])
            } else {
                ("file".into(), mode, std::fs::read(&path).unwrap())
            };
            out.insert(rel, v);
        }
    }
    out
}

fn cause() -> super::Cause {
    super::Cause {
        tool: "test".into(),
        request_id: String::new(),
        args: serde_json::Value::Null,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn rewinding_to_any_checkpoint_gives_that_tree(
        ops in proptest::collection::vec(op(), 1..24),
        pick in any::<prop::sample::Index>(),
    ) {
        let t = tempfile::tempdir().unwrap();
        let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
        std::fs::create_dir_all(&layer).unwrap();
        std::fs::create_dir_all(&writes).unwrap();
        let mut h = History::open(&layer, &writes, u64::MAX).unwrap();
        let mut trees = vec![tree(&writes)];
        for o in &ops {
            run(&writes, o);
            h.take(&cause()).unwrap();
            trees.push(tree(&writes));
        }
        let last = tree(&writes);
        // The feed's checkpoints saw what a whole listing sees: read all
        // again, nothing is new.
        h.forget_listing();
        let all = h.take(&cause()).unwrap();
        prop_assert_eq!((all.changed, all.removed), (0, 0), "the feed missed a change");
        trees.push(last.clone());
        let n = pick.index(trees.len());
        // `--upto N`'s view: the same tree, written whole from the history.
        let view = t.path().join("view");
        std::fs::create_dir(&view).unwrap();
        super::materialise::materialise(h.dir(), n as u64, &view).unwrap();
        prop_assert_eq!(&tree(&view), &trees[n], "materialised at {}", n);
        let (before, _) = rewind(&mut h, n as u64).unwrap();
        prop_assert_eq!(&tree(&writes), &trees[n], "after rewinding to {}", n);
        rewind(&mut h, before.n).unwrap();
        prop_assert_eq!(&tree(&writes), &last, "after undoing the rewind");
    }
}

/// Past its bound the store folds its oldest checkpoints: the newest can
/// still be rewound to, an old one says it was folded.
#[test]
fn the_store_folds_its_oldest_checkpoints_at_its_bound() {
    let t = tempfile::tempdir().unwrap();
    let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::create_dir_all(&writes).unwrap();
    let mut h = History::open(&layer, &writes, 10_000).unwrap();
    let mut folded = None;
    for i in 0..10u8 {
        // One file rewritten: old contents are only the history's.
        std::fs::write(writes.join("f"), vec![i; 3000]).unwrap();
        let l = h.take(&cause()).unwrap();
        folded = folded.or(l.folded_upto);
    }
    assert!(folded.is_some(), "the bound was never reached");
    assert!(super::store::objects_bytes(&h.dir().join("objects")) <= 10_000);
    assert!(matches!(
        h.state_at(1),
        Err(super::HistoryError::Folded(1, _))
    ));
    std::fs::write(writes.join("late"), b"x").unwrap();
    let (_, after) = rewind(&mut h, 9).unwrap();
    assert!(!writes.join("late").exists(), "{after:?}");
    assert_eq!(std::fs::read(writes.join("f")).unwrap(), vec![8u8; 3000]);
}

/// A file deeper than the kernel takes a path at once (17 directories of
/// 255 bytes: over 4,096) is listed, kept, and rewound like any other.
/// Control: the path itself is too long for one open.
#[test]
fn a_path_longer_than_the_kernel_takes_is_kept_and_rewound() {
    use std::os::fd::AsFd;
    let t = tempfile::tempdir().unwrap();
    let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::create_dir_all(&writes).unwrap();
    let mut h = History::open(&layer, &writes, u64::MAX).unwrap();
    let name = "d".repeat(255);
    let root = crate::sandbox::beneath::open_root(&writes).unwrap();
    let mut fd = root.try_clone().unwrap();
    let mut rel = std::path::PathBuf::new();
    for _ in 0..17 {
        nix::sys::stat::mkdirat(
            fd.as_fd(),
            name.as_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )
        .unwrap();
        fd =
            crate::sandbox::beneath::beneath(&fd, Path::new(&name), nix::fcntl::OFlag::O_DIRECTORY)
                .unwrap();
        rel.push(&name);
    }
    let f = nix::fcntl::openat(
        &fd,
        "deep",
        nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    nix::unistd::write(&f, b"deep").unwrap();
    drop(f);
    let deep = rel.join("deep");
    assert!(
        crate::sandbox::beneath::beneath(&root, &deep, nix::fcntl::OFlag::O_RDONLY).is_err(),
        "control: one open takes it"
    );
    let l = h.take(&cause()).unwrap();
    assert!(h.state().contains_key(&deep), "{l:?}");
    nix::unistd::unlinkat(&fd, "deep", nix::unistd::UnlinkatFlags::NoRemoveDir).unwrap();
    h.take(&cause()).unwrap();
    assert!(!h.state().contains_key(&deep));
    rewind(&mut h, l.n).unwrap();
    let back = nix::fcntl::openat(
        &fd,
        "deep",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(back), &mut text).unwrap();
    assert_eq!(text, "deep");
}

/// Past 32 checkpoints the feed hands over to a whole listing once and
/// takes up again: nothing is missed on either side of it.
#[test]
fn the_whole_listing_every_32nd_checkpoint_misses_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
    std::fs::create_dir_all(writes.join("d")).unwrap();
    std::fs::create_dir_all(&layer).unwrap();
    let mut h = History::open(&layer, &writes, u64::MAX).unwrap();
    for i in 0..70u32 {
        std::fs::write(
            writes.join("d").join(format!("f{}", i % 5)),
            i.to_le_bytes(),
        )
        .unwrap();
        let l = h.take(&cause()).unwrap();
        assert_eq!(l.changed, 1, "checkpoint {}", l.n);
    }
    h.forget_listing();
    let all = h.take(&cause()).unwrap();
    assert_eq!((all.changed, all.removed), (0, 0));
}

/// A rewind puts entries back owned as they were: as root, a file, a
/// directory and a link the agent's uid owned are made again with that
/// owner, not root's (which the agent could no longer change). Controls:
/// they are new inodes (made again, not left), and a file root makes
/// beside them is root's. As another uid every entry is that uid's and
/// stays so.
#[test]
fn a_rewind_puts_entries_back_owned_as_they_were() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
    std::fs::create_dir_all(writes.join("d")).unwrap();
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::write(writes.join("d/f"), b"agent's").unwrap();
    std::os::unix::fs::symlink("f", writes.join("d/l")).unwrap();
    let root = nix::unistd::geteuid().is_root();
    let (u, g) = match root {
        true => (12345, 23456),
        false => (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        ),
    };
    for p in ["d", "d/f", "d/l"] {
        std::os::unix::fs::lchown(writes.join(p), Some(u), Some(g)).unwrap();
    }
    let mut h = History::open(&layer, &writes, u64::MAX).unwrap();
    let kept = h.take(&cause()).unwrap();
    std::fs::remove_dir_all(writes.join("d")).unwrap();
    h.take(&cause()).unwrap();
    assert!(!writes.join("d").exists());
    rewind(&mut h, kept.n).unwrap();
    for p in ["d", "d/f", "d/l"] {
        let m = std::fs::symlink_metadata(writes.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (u, g), "{p}");
    }
    // Made again (the file system may give it the removed one's inode
    // number: ext4 does), with the content kept.
    assert_eq!(std::fs::read(writes.join("d/f")).unwrap(), b"agent's");
    if root {
        std::fs::write(writes.join("d/root"), b"").unwrap();
        assert_eq!(std::fs::metadata(writes.join("d/root")).unwrap().uid(), 0);
    }
}

/// A directory removed and made again at its path between two checkpoints
/// is another directory even when it has the removed one's inode number
/// (ext4 gives it at once): what is made below it afterwards is seen. (The
/// running rewind's property test found checkpoints blind below such a
/// directory: its watch had ended with the old one.) Control: a whole
/// listing agrees with the feed.
#[test]
fn a_directory_made_again_with_its_inode_number_is_watched_again() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let (layer, writes) = (t.path().join("layer"), t.path().join("writes"));
    std::fs::create_dir_all(writes.join("d")).unwrap();
    std::fs::write(writes.join("d/old"), b"1").unwrap();
    std::fs::create_dir_all(&layer).unwrap();
    let mut h = History::open(&layer, &writes, u64::MAX).unwrap();
    let ino = std::fs::metadata(writes.join("d")).unwrap().ino();
    std::fs::remove_dir_all(writes.join("d")).unwrap();
    std::fs::create_dir(writes.join("d")).unwrap();
    let same = std::fs::metadata(writes.join("d")).unwrap().ino() == ino;
    h.take(&cause()).unwrap();
    std::fs::write(writes.join("d/new"), b"2").unwrap();
    let l = h.take(&cause()).unwrap();
    assert_eq!(
        (l.changed, l.removed),
        (1, 0),
        "inode number reused: {same}"
    );
    h.forget_listing();
    let all = h.take(&cause()).unwrap();
    assert_eq!((all.changed, all.removed), (0, 0));
}

//! The agent's commits, through the door: for each repository the agent
//! committed in (a `.git` directory in the layer), its branches are fetched
//! as refs into a repository whose control plane the host made — objects
//! and refs only. Git never runs with the layer's configuration or hooks:
//! the layer's object files (names checked, regular files only) are
//! copied into a fresh bare repository of the host's (empty template, its
//! only configuration ours, the host repository's objects as its
//! alternate), its refs are parsed here, and the host's git fetches from it
//! with every object checked (`fetch.fsckObjects`).
//!
//! Into the workspace's own repository the branches come as
//! `refs/sandmux/ID/BRANCH` (the human's branches never move). A repository
//! the agent made (the host has no `.git` there) is made by the host's git
//! (`git init`), and gets the branches as its own, `HEAD` and the index at
//! the agent's `HEAD`: `git status` there shows what was not committed.

use super::error::RefsError;
use super::report::{Kind, Line};
use crate::sandbox::beneath::{beneath, entries};
use nix::fcntl::OFlag;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// Branches per repository, and bytes of object files per repository.
const MAX_REFS: usize = 1000;
const MAX_OBJECT_BYTES: u64 = 4 << 30;

/// The repositories the agent committed in: the workspace-relative
/// directories holding a `.git` directory of the layer (from the change
/// list's paths).
pub(crate) fn repositories<'a>(rels: impl Iterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for rel in rels {
        let parts: Vec<Component> = rel.components().collect();
        let Some(i) = parts.iter().position(|c| c.as_os_str() == ".git") else {
            continue;
        };
        let root: PathBuf = parts[..i].iter().collect();
        if !roots.contains(&root) {
            roots.push(root);
        }
    }
    roots
}

/// What may not come in through a commit: given a workspace-relative path
/// and what it is ("file", "symbolic link", "submodule"), why it is held
/// back (the door's own rules, `hold::held`).
pub(crate) type Check<'a> = &'a dyn Fn(&Path, &'static str) -> Option<String>;

/// What [`fetch`] did: the lines that say it, and the counts the door
/// decides on (never the lines).
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    pub(crate) lines: Vec<super::report::Line>,
    /// Branches fetched.
    pub(crate) fetched: usize,
    /// Branches not fetched (they carry what the door holds back).
    pub(crate) refused: usize,
}

/// Fetches the agent's branches of the repository at `root` (relative to
/// the workspace, whose root is `lower`); the lines say what came in and
/// what to do next. A branch whose new commits carry anything `check`
/// holds back is not fetched, and named. `made`: the agent made the
/// directory `root` (a repository may then be made there inside the
/// human's; in a directory the human had, it may not).
pub(crate) fn fetch(
    trees: &super::diff::Trees,
    (layer, ws): (&Path, &Path),
    root: &Path,
    id: &str,
    (check, made): (Check<'_>, bool),
) -> Result<Fetched, RefsError> {
    let top = crate::supervisor::layer::writes(layer);
    let upper_git = top.join(root).join(".git");
    plain_on_both_sides(&trees.lower, &top, root)?;
    let host_dir = ws.join(root);
    let host_git = host_dir.join(".git");
    let mut refs = read_refs(&upper_git, &host_git)?;
    let (fresh, host) = host_refs(&host_dir, &host_git, made)?;
    // Only what the agent moved: the host's own refs stay out.
    refs.retain(|r| !host.contains(r));
    if refs.is_empty() {
        return Ok(Fetched::default());
    }
    let tmp = layer.join(format!("fetch-{}", crate::nonce::hex()));
    // A copy's objects it was made with are the host's already.
    let copied = |p: &Path| p.strip_prefix(&top).is_ok_and(|rel| trees.untouched(rel));
    let done = stage(
        &tmp,
        (&upper_git, &copied),
        (!fresh).then_some(&host_git),
        &mut refs,
    )
    .and_then(|()| {
        let tips: Vec<&str> = host.iter().map(|(_, v)| v.as_str()).collect();
        super::history::refuse_held(&tmp, &mut refs, &tips, root, check)
    })
    .and_then(|refused| {
        let to = match refs.is_empty() {
            true => String::new(),
            false => fetch_staged(&tmp, &host_dir, fresh, id)?,
        };
        Ok((to, refused))
    });
    let _ = std::fs::remove_dir_all(&tmp);
    let (to, refused) = done?;
    let fetched = (refs.as_slice(), to.as_str(), refused.as_slice());
    told(fetched, (&upper_git, &host_dir), root, fresh, id)
}

/// Every directory on the way to the agent's `.git` is the layer's own,
/// never a link; and the host's, the workspace's own directories (a link
/// there is the human's, to anywhere: git never runs through it).
fn plain_on_both_sides(lower: &OwnedFd, top: &Path, root: &Path) -> Result<(), RefsError> {
    let mut at = top.to_path_buf();
    for c in root.join(".git").components() {
        at.push(c);
        if !real_dir(&at) {
            return Err(RefsError::NotLayerDir(at));
        }
    }
    beneath(lower, root, OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(RefsError::NotPlain)?;
    Ok(())
}

/// Whether the host has no repository there yet (`fresh`), and the refs
/// it has. A fresh one inside the human's repository is refused unless
/// the agent made the directory: a repository made there would take the
/// human's git commands.
fn host_refs(
    host_dir: &Path,
    host_git: &Path,
    made: bool,
) -> Result<(bool, Vec<(String, String)>), RefsError> {
    match std::fs::symlink_metadata(host_git) {
        Ok(m) if m.is_dir() => Ok((false, read_refs(host_git, host_git)?)),
        Ok(_) => Err(RefsError::NotHostDir(host_git.to_path_buf())),
        Err(_) => {
            let inside = git_out(host_dir, &["rev-parse", "--show-toplevel"]);
            if let (Ok(top), false) = (inside, made) {
                return Err(RefsError::InsideRepo(PathBuf::from(top.trim())));
            }
            Ok((true, Vec::new()))
        }
    }
}

/// The host's git fetches the staged branches: into `refs/heads` of a
/// repository it makes (`fresh`), else under `refs/sandmux/ID`. Returns
/// where they went.
fn fetch_staged(tmp: &Path, host_dir: &Path, fresh: bool, id: &str) -> Result<String, RefsError> {
    let to = match fresh {
        true => "refs/heads".to_string(),
        false => format!("refs/sandmux/{id}"),
    };
    if fresh {
        git(host_dir, &["init", "-q"])?;
    }
    let spec = format!("+refs/heads/*:{to}/*");
    let src = tmp.to_string_lossy().into_owned();
    git(
        host_dir,
        &[
            "-c",
            "fetch.fsckObjects=true",
            "fetch",
            "-q",
            "--no-tags",
            "--update-head-ok",
            "--no-write-fetch-head",
            &src,
            &spec,
        ],
    )?;
    Ok(to)
}

/// What was fetched and refused, said; a repository the host's git made
/// is set to the agent's HEAD (`git reset`: the index, never the files).
fn told(
    (refs, to, refused): (&[(String, String)], &str, &[String]),
    (upper_git, host_dir): (&Path, &Path),
    root: &Path,
    fresh: bool,
    id: &str,
) -> Result<Fetched, RefsError> {
    let shown = if root.as_os_str().is_empty() {
        ".".into()
    } else {
        root.display().to_string()
    };
    let mut lines: Vec<Line> = refused
        .iter()
        .map(|r| {
            Line::new(
                Kind::Conflict,
                format!("conflict {shown}: a branch of the agent's was not fetched ({r})"),
            )
        })
        .collect();
    let counts = (refs.len(), refused.len());
    if refs.is_empty() {
        return Ok(Fetched {
            lines,
            fetched: 0,
            refused: counts.1,
        });
    }
    let names: Vec<String> = refs.iter().map(|(n, _)| format!("{to}/{n}")).collect();
    lines.push(Line::note(format!(
        "fetched the agent's commits in {shown}: {}",
        names.join(", ")
    )));
    if fresh {
        if let Some(head) = agent_head(upper_git).filter(|h| refs.iter().any(|(n, _)| n == h)) {
            git(
                host_dir,
                &["symbolic-ref", "HEAD", &format!("refs/heads/{head}")],
            )?;
            git(host_dir, &["reset", "-q"])?;
        }
        lines.push(Line::note(format!("{shown}: a repository the host's git made, at the agent's HEAD (`git status` there shows what was not committed)")));
    } else {
        lines.push(Line::note(format!("{shown}: the files are applied as files; to make the agent's commits your branch's history too: `git reset refs/sandmux/{id}/BRANCH` (moves HEAD and the index, never the files; check `git log HEAD..refs/sandmux/{id}/BRANCH` first)")));
    }
    Ok(Fetched {
        lines,
        fetched: counts.0,
        refused: counts.1,
    })
}

/// The bare repository the host's git fetches from: made by the host's
/// git, the layer's objects copied in (the host repository's objects as
/// its alternate), the agent's branches set (those naming a missing
/// object dropped).
fn stage(
    tmp: &Path,
    (upper_git, copied): (&Path, &dyn Fn(&Path) -> bool),
    host_git: Option<&PathBuf>,
    refs: &mut Vec<(String, String)>,
) -> Result<(), RefsError> {
    std::fs::create_dir(tmp).map_err(|source| RefsError::Path {
        path: tmp.to_path_buf(),
        source,
    })?;
    git(tmp, &["init", "-q", "--bare", "--template="])?;
    let objects = upper_git.join("objects");
    match std::fs::symlink_metadata(&objects) {
        Ok(m) if m.is_dir() => copy_objects(&objects, &tmp.join("objects"), copied)?,
        Ok(_) => return Err(RefsError::NotLayerDir(objects)),
        Err(_) => {} // no object of the agent's: its refs name the host's
    }
    if let Some(h) = host_git {
        let alt = h.join("objects");
        std::fs::write(
            tmp.join("objects/info/alternates"),
            format!("{}\n", alt.display()),
        )
        .map_err(RefsError::Alternates)?;
    }
    refs.retain(|(name, sha)| {
        git(tmp, &["update-ref", &format!("refs/heads/{name}"), sha]).is_ok()
    });
    Ok(())
}

/// [`git`], returning its standard output.
pub(crate) fn git_out(dir: &Path, args: &[&str]) -> Result<String, RefsError> {
    let out = command(dir, args).output().map_err(RefsError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(RefsError::Git {
            cmd: args.first().copied().unwrap_or("").to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_CONFIG")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .stdin(std::process::Stdio::null());
    c
}

/// Runs the host's git in `dir` (`-C`), with none of the caller's git
/// variables; `Err` carries its stderr.
fn git(dir: &Path, args: &[&str]) -> Result<(), RefsError> {
    git_out(dir, args).map(drop)
}

/// A directory, not a link to one.
fn real_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

/// A ref name the host takes: git's rules, narrowed to plain characters.
fn plain_ref(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.contains("..")
        && !name.contains("//")
        && !name
            .split('/')
            .any(|p| p.starts_with('.') || p.ends_with(".lock"))
}

fn sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads a file of the layer's `.git` no larger than `max`, not followed.
fn read_small(p: &Path, max: u64) -> Option<String> {
    crate::sandbox::beneath::read_small(p, max)
}

/// The agent's branches: `packed-refs` (the layer's, else the host's) then
/// the loose refs of the layer (which win), names and values checked.
fn read_refs(upper_git: &Path, host_git: &Path) -> Result<Vec<(String, String)>, RefsError> {
    let mut refs: Vec<(String, String)> = Vec::new();
    let mut put = |name: String, value: &str| {
        if plain_ref(&name) && sha(value) && refs.len() < MAX_REFS {
            refs.retain(|(n, _)| *n != name);
            refs.push((name, value.to_string()));
        }
    };
    let packed = read_small(&upper_git.join("packed-refs"), 64 << 20)
        .or_else(|| read_small(&host_git.join("packed-refs"), 64 << 20))
        .unwrap_or_default();
    for line in packed.lines() {
        if let Some((v, name)) = line.split_once(' ') {
            if let Some(b) = name.strip_prefix("refs/heads/") {
                put(b.to_string(), v);
            }
        }
    }
    let heads = upper_git.join("refs/heads");
    let mut stack = vec![heads.clone()];
    if !(real_dir(&upper_git.join("refs")) && real_dir(&heads)) {
        stack.clear();
    }
    while let Some(d) = stack.pop() {
        for (name, _) in entries(&d).into_iter().flatten() {
            let p = d.join(name);
            let Ok(m) = p.symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && m.nlink() == 1 {
                let name = p
                    .strip_prefix(&heads)
                    .map(|r| r.to_string_lossy().into_owned());
                if let (Ok(name), Some(v)) = (name, read_small(&p, 100)) {
                    put(name, v.trim());
                }
            }
        }
    }
    Ok(refs)
}

/// The branch the agent's `HEAD` names, if it names one.
fn agent_head(upper_git: &Path) -> Option<String> {
    let head = read_small(&upper_git.join("HEAD"), 300)?;
    let name = head.trim().strip_prefix("ref: refs/heads/")?.to_string();
    plain_ref(&name).then_some(name)
}

/// Copies the layer's object files into `to`: loose objects and packs by
/// their names only, regular files with one link, at most
/// [`MAX_OBJECT_BYTES`] in all.
fn copy_objects(from: &Path, to: &Path, copied: &dyn Fn(&Path) -> bool) -> Result<(), RefsError> {
    let mut total = 0u64;
    let hex = |s: &OsStr, n: &[usize]| {
        s.to_str().is_some_and(|t| {
            n.contains(&t.len())
                && t.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    };
    for (name, _) in entries(from).into_iter().flatten() {
        let dpath = from.join(&name);
        let pack = name == "pack";
        if !pack && !hex(&name, &[2]) || !real_dir(&dpath) {
            continue;
        }
        for (fname, _) in entries(&dpath).into_iter().flatten() {
            let fpath = dpath.join(&fname);
            let ok = if pack {
                fname.to_str().is_some_and(|t| {
                    let stem = t
                        .strip_prefix("pack-")
                        .and_then(|t| t.strip_suffix(".pack").or_else(|| t.strip_suffix(".idx")));
                    stem.is_some_and(|s| hex(OsStr::new(s), &[40, 64]))
                })
            } else {
                hex(&fname, &[38, 62])
            };
            let Ok(m) = fpath.symlink_metadata() else {
                continue;
            };
            if !ok || !m.is_file() || m.nlink() != 1 || copied(&fpath) {
                continue;
            }
            total += m.len();
            if total > MAX_OBJECT_BYTES {
                return Err(RefsError::TooLarge(MAX_OBJECT_BYTES));
            }
            let dest = to.join(&name);
            std::fs::create_dir_all(&dest).map_err(|source| RefsError::Path {
                path: dest.clone(),
                source,
            })?;
            copy_nofollow(&fpath, &dest.join(&fname))?;
        }
    }
    Ok(())
}

/// Copies a regular file, its last component not followed.
fn copy_nofollow(src: &Path, dst: &Path) -> Result<(), RefsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RefsError::Path { path, source }
    };
    let mut s = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)
        .map_err(at(src))?;
    let mut d = std::fs::File::create_new(dst).map_err(at(dst))?;
    std::io::copy(&mut s, &mut d).map_err(at(dst))?;
    Ok(())
}

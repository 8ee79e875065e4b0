//! What host git says about the workspace's repository, asked once per
//! `diff` or `apply`, all four questions at once: where its top is, which
//! files it reads as configuration (with their entries as git parsed them),
//! its `info/exclude` and its `core.excludesFile`. The processes are
//! started before the layer is walked and waited for after, so their
//! start-up (a few milliseconds each) overlaps the walk instead of adding
//! to it. The answers are git's own, exactly as when each was asked alone:
//! [`super::named`] and [`super::ignored`] take them from here.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One configuration file git reads for a repository and its entries
/// (keys as git prints them), includes not followed.
pub(crate) type Listed = (PathBuf, Vec<(String, String)>);

/// The questions, asked and not yet answered.
pub(crate) struct Asking {
    ws: PathBuf,
    top: Option<Child>,
    listing: Option<Child>,
    exclude: Option<Child>,
    excludes_file: Option<Child>,
}

/// The answers.
pub(crate) struct GitFacts {
    /// The workspace they are about.
    pub(crate) ws: PathBuf,
    /// `rev-parse --show-toplevel` (None: not in a work tree).
    pub(crate) top: Option<PathBuf>,
    /// The files git reads first, with their entries.
    pub(crate) files: Vec<Listed>,
    /// `rev-parse --git-path info/exclude`, as printed (relative to the
    /// workspace, or absolute).
    pub(crate) info_exclude: Option<String>,
    /// `config --path --get core.excludesFile`.
    pub(crate) excludes_file: Option<String>,
}

/// `git -C WS -c safe.directory=* ARGS` with `unset` taken out of its
/// environment, started; None when git cannot be run.
fn start(ws: &Path, args: &[&str], unset: &[&str]) -> Option<Child> {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(ws)
        .args(["-c", "safe.directory=*"])
        .args(args);
    for v in unset {
        c.env_remove(v);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// What a started git printed, when it succeeded (`ok_only`) or at all.
fn answer(child: Option<Child>, ok_only: bool) -> Option<Vec<u8>> {
    let out = child?.wait_with_output().ok()?;
    (out.status.success() || !ok_only).then_some(out.stdout)
}

fn line(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).trim().to_string()
}

impl Asking {
    /// Starts the four questions about the workspace `ws`.
    pub(crate) fn start(ws: &Path) -> Asking {
        Asking {
            ws: ws.to_path_buf(),
            top: start(
                ws,
                &["rev-parse", "--show-toplevel"],
                &["GIT_DIR", "GIT_WORK_TREE"],
            ),
            listing: start(ws, &LISTING, &LISTING_UNSET),
            exclude: start(
                ws,
                &["rev-parse", "--git-path", "info/exclude"],
                &["GIT_DIR"],
            ),
            excludes_file: start(
                ws,
                &["config", "--path", "--get", "core.excludesFile"],
                &["GIT_DIR"],
            ),
        }
    }

    /// Waits for the answers.
    pub(crate) fn answers(mut self) -> GitFacts {
        let top = answer(self.top.take(), true).map(|b| {
            PathBuf::from(
                String::from_utf8_lossy(&b)
                    .trim_end_matches('\n')
                    .to_string(),
            )
        });
        let files = answer(self.listing.take(), false)
            .map(|b| listed(&self.ws, &b))
            .unwrap_or_default();
        GitFacts {
            top,
            files,
            info_exclude: answer(self.exclude.take(), true).map(line),
            excludes_file: answer(self.excludes_file.take(), true).map(line),
            ws: self.ws.clone(),
        }
    }
}

impl Drop for Asking {
    /// Questions never waited for (the walk failed) leave no process behind.
    fn drop(&mut self) {
        for c in [
            &mut self.top,
            &mut self.listing,
            &mut self.exclude,
            &mut self.excludes_file,
        ] {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The listing of every configuration file git reads first.
const LISTING: [&str; 5] = [
    "config",
    "--list",
    "--no-includes",
    "--show-origin",
    "--null",
];
/// What the listing must not take from the environment.
const LISTING_UNSET: [&str; 4] = [
    "GIT_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
];

/// The files git reads first for the repository at `repo`, each with its
/// entries: one `config --list --show-origin`, started and waited for.
pub(crate) fn git_files(repo: &Path) -> Vec<Listed> {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(repo)
        .args(["-c", "safe.directory=*"])
        .args(LISTING);
    for v in LISTING_UNSET {
        c.env_remove(v);
    }
    let out = c.stdin(Stdio::null()).stderr(Stdio::null()).output();
    out.map(|o| listed(repo, &o.stdout)).unwrap_or_default()
}

/// A `--show-origin --null` listing by file: origin NUL key NL value NUL,
/// repeated; origins that are not files (the command line) are left out.
fn listed(repo: &Path, out: &[u8]) -> Vec<Listed> {
    let mut files: Vec<Listed> = Vec::new();
    let mut parts = out.split(|b| *b == 0);
    while let (Some(origin), Some(entry)) = (parts.next(), parts.next()) {
        let Some(f) = origin.strip_prefix(b"file:") else {
            continue;
        };
        let f = Path::new(std::ffi::OsStr::from_bytes(f));
        let f = if f.is_relative() {
            repo.join(f)
        } else {
            f.to_path_buf()
        };
        let e = String::from_utf8_lossy(entry);
        let (k, v) = e.split_once('\n').unwrap_or((&e, ""));
        let kv = (k.to_string(), v.to_string());
        match files.iter_mut().find(|(g, _)| *g == f) {
            Some((_, entries)) => entries.push(kv),
            None => files.push((f, vec![kv])),
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_by_file_and_the_command_line_left_out() {
        let out = b"command line:\0safe.directory\n*\0file:.git/config\0core.bare\nfalse\0file:/etc/x\0a.b\nc\0file:.git/config\0include.path\n../x.inc\0";
        let l = listed(Path::new("/w"), out);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].0, PathBuf::from("/w/.git/config"));
        assert_eq!(
            l[0].1,
            vec![
                ("core.bare".to_string(), "false".to_string()),
                ("include.path".to_string(), "../x.inc".to_string())
            ]
        );
        assert_eq!(l[1].0, PathBuf::from("/etc/x"));
    }
}

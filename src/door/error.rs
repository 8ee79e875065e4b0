//! The door's errors, one type per mechanism: what keeps an action from
//! being done at all ([`DoorError`]), why one change is a conflict
//! ([`ApplyError`]), why a step of an undo is left ([`UndoError`]), why an
//! agent's repository is not fetched ([`RefsError`]), and the journal's,
//! the trees', the record's, the review's, `log`/`diff --call`'s and
//! `rewind`'s. Each carries its path, ref or id as data and renders the
//! line the human reads; nothing in the door reads a line back. The text
//! is made only where the door prints it (its CLI entry points) or where
//! a report line says it.

use crate::supervisor::history::HistoryError;
use crate::supervisor::layer::LayerError;
use std::path::PathBuf;

/// What keeps the door from doing what it was asked: nothing was applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DoorError {
    #[error("{0}")]
    Find(#[from] LayerError),
    /// The layer and the workspace could not be read.
    #[error("the layer: {0}")]
    Trees(#[from] DiffError),
    /// The layer has no history (`--upto`).
    #[error("the layer: {0}")]
    History(HistoryError),
    /// Checkpoint `n` could not be written out as a view.
    #[error("the layer: checkpoint {n} of layer {id}: {source}")]
    Checkpoint {
        n: u64,
        id: String,
        source: HistoryError,
    },
    /// The user's configuration could not be loaded.
    #[error("the layer: {0}")]
    Config(crate::profile::user::UserConfigError),
    /// The view made could not take its place.
    #[error("the layer: {}: {source}", dir.display())]
    View {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// `diff --upto` of an instance still running.
    #[error("the layer: instance {0} is still running: `--upto` reviews an ended instance's checkpoints; stop it first (sandmux stop {0}), or follow it with `sandmux log {0}`")]
    Running(String),
    #[error("{}: paths are relative to the workspace, without '..'", .0.display())]
    BadPath(PathBuf),
    #[error("the last review: {0}")]
    Review(#[from] ReviewError),
    /// `--expect` names another digest, one a `diff` showed (`names`:
    /// what changed since, shown).
    #[error("the layer's changes are digest {digest}, not {want} (changed since that diff: {names}): nothing applied; run `sandmux diff` again")]
    ExpectChanged {
        digest: String,
        want: String,
        names: String,
    },
    /// `--expect` names a digest no `diff` of this layer showed.
    #[error("the layer's changes are digest {digest}, not {want} (no `sandmux diff` of this layer showed it): nothing applied; run `sandmux diff` again")]
    ExpectUnseen { digest: String, want: String },
    /// The last review was of another state of the layer (`was`, `this`:
    /// the checkpoint of a view, None: the whole layer).
    #[error("your last review of layer {id} was {}, not of what this apply brings: nothing applied; run {} first", diff_run(id, *was), diff_run(id, *this))]
    ReviewedElsewhere {
        id: String,
        was: Option<u64>,
        this: Option<u64>,
    },
    #[error("your last `sandmux diff` was of the instance while it ran, when the agent could change what it showed: nothing applied; run `sandmux diff` again now that it has ended")]
    ReviewedRunning,
    /// Changes to be brought differ from the last review (`names`, shown).
    #[error("not as your last `sandmux diff` showed it: {names}: nothing applied; run `sandmux diff` again, or `--expect {digest}` to take the layer as it is now")]
    NotAsShown { names: String, digest: String },
    #[error("this apply writes {need} bytes (apparent sizes) and the workspace's file system has {free} free: nothing applied; free space, or apply fewer PATHS")]
    NoSpace { need: u64, free: u64 },
    #[error("checkpoint {n} written out as a view needs {need} bytes (apparent sizes, each content once, and every name and directory) and {inodes} inodes, and the layer's file system has {free} bytes free or fewer inodes: nothing written; free space, or review the whole layer (`sandmux diff ID`)")]
    ViewNoSpace {
        n: u64,
        need: u64,
        free: u64,
        inodes: u64,
    },
    #[error("checkpoint {n} written out as a view needs {need} bytes (apparent sizes, each content once) and the kept layers hold {kept}: past [workspace] kept_bytes = {cap} of {}: nothing written; see them with `sandmux ps --all`, or review the whole layer (`sandmux diff ID`)", config.display())]
    ViewOverKept {
        n: u64,
        need: u64,
        kept: u64,
        cap: u64,
        config: PathBuf,
    },
    /// `of`: "the workspace's" or "the layer's".
    #[error("{of} free space: {source}")]
    FreeSpace {
        of: &'static str,
        source: nix::Error,
    },
    #[error("no `apply {id} --upto {n}` ran: nothing to undo")]
    NothingToUndo { id: String, n: u64 },
    /// A plain `--undo` where only `apply --upto` ran (`views`: theirs).
    #[error("no whole `apply {id}` ran; `apply --upto` did, and its journal is in that checkpoint's view: {}", undo_runs(id, views))]
    UndoInView { id: String, views: Vec<u64> },
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Undo(#[from] UndoError),
}

/// The `diff` that reviews the view of checkpoint `n` (None: the layer).
fn diff_run(id: &str, n: Option<u64>) -> String {
    match n {
        Some(n) => format!("`sandmux diff {id} --upto {n}`"),
        None => format!("`sandmux diff {id}`"),
    }
}

/// The `--undo`s of each view an `apply --upto` ran on.
fn undo_runs(id: &str, views: &[u64]) -> String {
    let runs: Vec<String> = views
        .iter()
        .map(|n| format!("`sandmux apply {id} --upto {n} --undo`"))
        .collect();
    runs.join(", ")
}

/// The apply journal (`apply.jsonl`) and the layer's `taken/`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("the journal {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A complete line that does not parse.
    #[error("{}: line {line}: {source}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("the journal in {}: {source}", layer.display())]
    Open {
        layer: PathBuf,
        source: std::io::Error,
    },
    #[error("cutting the journal's torn line: {0}")]
    Cut(std::io::Error),
    #[error("{}: {source}", path.display())]
    Taken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the layer's taken/: {0}")]
    TakenDir(nix::Error),
    #[error("syncing the journal: {0}")]
    Sync(std::io::Error),
    #[error("syncing the file system: {0}")]
    SyncFs(nix::Error),
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("writing the journal: {0}")]
    Write(std::io::Error),
}

/// Why one change was not applied: a conflict, its path left as it is.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    /// A link or a special file.
    #[error("a {what} is never applied")]
    Never { what: &'static str },
    #[error("unreadable in the layer: {0}")]
    Unreadable(String),
    #[error("no name")]
    NoName,
    #[error("its directory in the workspace: {0}")]
    Parent(nix::Error),
    #[error("something else is there now")]
    SomethingElse,
    #[error("mkdir: {0}")]
    Mkdir(nix::Error),
    #[error("changed on the host since the instance started")]
    ChangedOnHost,
    #[error("removed on the host since the instance started")]
    RemovedOnHost,
    #[error("the layer's file: {0}")]
    LayerFile(nix::Error),
    #[error("not a regular file in the layer")]
    NotRegular,
    #[error("a temporary file beside it: {0}")]
    Temp(nix::Error),
    #[error("copying: {0}")]
    Copying(std::io::Error),
    #[error("putting it in place: {0}")]
    Placing(nix::Error),
    #[error("moving it into place: {0}")]
    Moving(nix::Error),
    /// A directory below the one to remove could not be listed.
    #[error("{} could not be read ({source}): left", dir.display())]
    Unlisted { dir: PathBuf, source: nix::Error },
    #[error("more than 100,000 entries to check: left, remove it yourself")]
    TooManyBelow,
    /// The directory to remove holds a repository (shown: the name).
    #[error("it holds a repository ({}): left, remove it yourself", .0.display())]
    HoldsRepo(PathBuf),
    /// Something below the directory to remove changed on the host.
    #[error("{} changed on the host since the instance started", .0.display())]
    BelowChanged(PathBuf),
    #[error("keeping it aside: {0}")]
    KeepAside(nix::Error),
    #[error("on another file system and not a regular file: left in place")]
    OtherFs,
    /// The copy in `taken/` (across file systems).
    #[error("{}: {source}", path.display())]
    Taken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("removing it: {0}")]
    Removing(nix::Error),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("{0}")]
    Sys(nix::Error),
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Trees(#[from] DiffError),
}

/// Reading the layer against the workspace.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiffError {
    #[error("opening {}: {source}", path.display())]
    Open { path: PathBuf, source: nix::Error },
    #[error("the copy's snapshot in {}: {source}", dir.display())]
    Snapshot {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Stat(nix::Error),
    /// A copy's entry changed after the instance ended (the snapshot's
    /// refusal, as `supervisor::copy` says it).
    #[error("{0}")]
    Ended(crate::supervisor::copy::ChangedAfterEnd),
}

/// `apply --undo`: why it did not run, or why one step was left.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UndoError {
    #[error("no journal: {} is not there", .0.display())]
    NoJournal(PathBuf),
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("rewriting the journal: {0}")]
    Rewrite(std::io::Error),
    #[error("no name")]
    NoName,
    #[error("its directory: {0}")]
    Dir(nix::Error),
    /// A directory the apply made holds something now.
    #[error("not removed ({0}): it holds something now")]
    NotEmpty(nix::Error),
    #[error("changed since apply: left")]
    Changed,
    #[error("something is there again: left")]
    ThereAgain,
    #[error("a directory on another file system: left in the layer's taken/")]
    DirAcross,
    #[error("{0}")]
    Io(std::io::Error),
    #[error("{0}")]
    Sys(nix::Error),
}

/// Why the agent's commits of one repository were not fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RefsError {
    #[error("{}: not a directory of the layer", .0.display())]
    NotLayerDir(PathBuf),
    #[error("not a plain directory of the workspace ({0})")]
    NotPlain(nix::Error),
    #[error("{}: not a directory on the host", .0.display())]
    NotHostDir(PathBuf),
    /// A repository the host has not, inside the human's (its top).
    #[error("it lies inside the repository at {}: its commits stay in the layer", .0.display())]
    InsideRepo(PathBuf),
    #[error("{}: {source}", path.display())]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("alternates: {0}")]
    Alternates(std::io::Error),
    /// The host's git did not start.
    #[error("git: {0}")]
    Spawn(std::io::Error),
    /// The host's git failed: its subcommand and stderr.
    #[error("git {cmd}: {stderr}")]
    Git { cmd: String, stderr: String },
    #[error("more than {0} bytes of objects: not fetched")]
    TooLarge(u64),
    /// The repository lies at or below a path the door holds back
    /// (`name`, shown; `why`, the rule's).
    #[error("{name} is held back: {why}")]
    HeldBack { name: String, why: String },
}

/// The door's audit record could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("the layer has no state directory")]
    NoStateDir,
    #[error("no name for the audit log")]
    NoName,
    /// The audit log could not be opened.
    #[error("{0}: the door records what it does, and does nothing it cannot record")]
    Refused(crate::audit::OpenError),
}

/// The last review (`reviewed.json`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// `sandmux log ID`, `sandmux diff ID --call N | --since N`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallsError {
    #[error("{0}")]
    Layer(#[from] LayerError),
    #[error("{0}")]
    History(#[from] HistoryError),
    #[error("call 0 is the layer at the start: nothing before it")]
    CallZero,
}

/// `sandmux rewind ID N`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewindError {
    #[error("{0}")]
    Layer(#[from] LayerError),
    /// The instance still runs (its layer is in use): its `serve` is to
    /// be asked.
    #[error("{live}")]
    Live { id: String, live: LayerError },
    /// A running instance whose `serve` does not answer (a `run` or
    /// `shell`, or one that is ending).
    #[error("{live}, and no `sandmux serve` of it answers: stop it first (sandmux stop {id})")]
    NotServed { id: String, live: LayerError },
    /// A running instance's rewind failed (its `serve`'s words).
    #[error("failed: rewinding instance {id} to checkpoint {n}: {why}")]
    RunningFailed { id: String, n: u64, why: String },
    #[error("{0}")]
    History(#[from] HistoryError),
    #[error("{0}")]
    Record(#[from] RecordError),
    /// The rewind itself failed (recorded as this line).
    #[error("failed: rewinding layer {id} to checkpoint {n}: {source}")]
    Failed {
        id: String,
        n: u64,
        source: HistoryError,
    },
}

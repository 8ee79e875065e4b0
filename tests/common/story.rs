//! The one builder of `sandmux run [-p PROFILE] -w WS -- ARGV…` for the Rust
//! tests, and outputs that fail with the whole story: the command, its exit
//! status, stdout and stderr (as ripgrep's test harness does).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `sandmux run` in workspace `ws` (profile `default` unless [`Run::profile`]).
pub(crate) fn run(ws: impl AsRef<Path>) -> Run {
    Run {
        profile: None,
        ws: ws.as_ref().to_path_buf(),
        argv: Vec::new(),
        state: None,
        flags: Vec::new(),
    }
}

/// A `sandmux run` invocation being built.
#[derive(Clone)]
pub(crate) struct Run {
    profile: Option<OsString>,
    ws: PathBuf,
    argv: Vec<OsString>,
    state: Option<PathBuf>,
    flags: Vec<OsString>,
}

impl Run {
    /// `-p PROFILE`: a built-in name or a file.
    pub(crate) fn profile(mut self, p: impl AsRef<OsStr>) -> Run {
        self.profile = Some(p.as_ref().to_os_string());
        self
    }

    /// The command to run inside, after `--`.
    pub(crate) fn cmd<S: AsRef<OsStr>>(mut self, argv: impl IntoIterator<Item = S>) -> Run {
        self.argv = argv
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        self
    }

    /// `bash -c SCRIPT` inside.
    pub(crate) fn script(self, script: &str) -> Run {
        self.cmd(["bash", "-c", script])
    }

    /// A flag of `run` (before `--`), with its value.
    pub(crate) fn flag(mut self, name: &str, value: &str) -> Run {
        self.flags.extend([name.into(), value.into()]);
        self
    }

    /// `-q`: no informational lines on stderr.
    #[allow(dead_code)]
    pub(crate) fn quiet(mut self) -> Run {
        self.flags.push("-q".into());
        self
    }

    /// `--workspace-mode live`: the agent writes the host's tree, guarded.
    pub(crate) fn live(self) -> Run {
        self.flag("--workspace-mode", "live")
    }

    /// `XDG_STATE_HOME` for the run (the workspace guard's state).
    pub(crate) fn state(mut self, dir: impl AsRef<Path>) -> Run {
        self.state = Some(dir.as_ref().to_path_buf());
        self
    }

    /// sandmux's arguments: `run [-p P] -w WS -- ARGV…` (for wrappers that
    /// start the binary under another program).
    pub(crate) fn args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["run".into()];
        if let Some(p) = &self.profile {
            v.extend(["-p".into(), p.clone()]);
        }
        v.extend(self.flags.iter().cloned());
        v.extend(["-w".into(), self.ws.clone().into_os_string(), "--".into()]);
        v.extend(self.argv.iter().cloned());
        v
    }

    /// The command, stdin closed; stdout and stderr as `Command` leaves them.
    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new(super::bin());
        c.args(self.args()).stdin(Stdio::null());
        if let Some(s) = &self.state {
            c.env("XDG_STATE_HOME", s);
        }
        c
    }

    /// Runs it to the end.
    pub(crate) fn output(&self) -> Ran {
        ran(&mut self.command())
    }
}

/// Runs `cmd` to the end, keeping what it was for the story.
pub(crate) fn ran(cmd: &mut Command) -> Ran {
    let line = shown(cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not start {line}: {e}"));
    Ran { cmd: line, out }
}

/// A finished command: derefs to its [`Output`]; the checks panic with
/// the whole story.
pub(crate) struct Ran {
    /// The command line, shell-quoted.
    pub cmd: String,
    /// What it did.
    pub out: Output,
}

impl std::ops::Deref for Ran {
    type Target = Output;
    fn deref(&self) -> &Output {
        &self.out
    }
}

impl Ran {
    /// stdout, lossily decoded.
    pub(crate) fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    /// stderr, lossily decoded.
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// Asserts the exit status.
    #[track_caller]
    pub(crate) fn code(&self, want: i32) -> &Ran {
        if self.out.status.code() != Some(want) {
            panic!("expected exit status {want}\n{self}");
        }
        self
    }

    /// Asserts `needle` is in stdout or stderr.
    #[track_caller]
    pub(crate) fn says(&self, needle: &str) -> &Ran {
        if !self.stdout().contains(needle) && !self.stderr().contains(needle) {
            panic!("expected {needle:?} in the output\n{self}");
        }
        self
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmd,
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }
}

/// A command line as a shell would take it back.
fn shown(cmd: &Command) -> String {
    let quote = |s: &OsStr| {
        let s = s.to_string_lossy();
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-=:,@%+".contains(c))
        {
            s.into_owned()
        } else {
            format!("'{}'", s.replace('\'', "'\\''"))
        }
    };
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ")
}

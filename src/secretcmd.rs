//! Secrets a host-side command prints (a `[[credentials]]` entry's
//! `from_command`): the profile's argv (no shell), run with a cleared
//! environment (`PATH` and `HOME` of sandmux's own, then the entry's
//! `command_env`), in `/`, stdin and stderr on `/dev/null` (stderr could
//! hold the value: it is not kept), in a process group of its own that is
//! killed whole at the time limit. At most [`MAX_OUT`] bytes of stdout are
//! read. The output is the value and, optionally, its lifetime ([`parse`]).
//! Errors never quote the output.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// The command's `PATH` (the profile's `command_env` may set another).
pub(crate) const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The shortest and longest lifetime a value is taken to have (a shorter
/// one would have the command run again and again; a longer one is a
/// year, and no instant overflows).
pub(crate) const LIFETIME: (u64, u64) = (10, 366 * 24 * 3600);

/// Most bytes of a command's output read.
pub(crate) const MAX_OUT: usize = 64 << 10;

/// Why a command gave no value. Never quotes the output.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretCmdError {
    /// The profile's argv is empty.
    #[error("from_command is empty")]
    Empty,
    /// The program could not be started.
    #[error("{prog}: {source}")]
    Spawn {
        prog: String,
        source: std::io::Error,
    },
    /// Its stdout was not kept (it always is).
    #[error("no stdout")]
    NoStdout,
    /// It ran past the time limit.
    #[error("{prog} did not finish within {secs} s (its process group was killed)")]
    Timeout { prog: String, secs: u64 },
    /// It exited with another status than 0.
    #[error("{prog} failed ({status})")]
    Failed {
        prog: String,
        status: std::process::ExitStatus,
    },
    /// Its stdout stayed open past the time limit.
    #[error("the output did not end in time")]
    OutputLate,
    /// It printed more than [`MAX_OUT`] bytes.
    #[error("the output is over {MAX_OUT} bytes")]
    OutputLarge,
    /// Its stdout could not be read.
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// Output starting with `{` that is no JSON.
    #[error("the output is not a JSON object")]
    NotJson,
    /// JSON without a value.
    #[error("the JSON output has no \"access_token\" or \"value\" string")]
    NoValue,
    /// An `expires_in` that is no lifetime.
    #[error("\"expires_in\" is not a number of seconds (at least 1)")]
    ExpiresIn,
}

/// Runs `argv` with `env` (over `PATH` and `HOME`), for at most `limit`;
/// returns its stdout when it exits 0.
pub(crate) fn run(
    argv: &[String],
    env: &BTreeMap<String, String>,
    limit: Duration,
) -> Result<Vec<u8>, SecretCmdError> {
    let (prog, args) = argv.split_first().ok_or(SecretCmdError::Empty)?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).env_clear().current_dir("/").process_group(0);
    // A fixed PATH, not sandmux's own (which may name a venv or
    // `node_modules/.bin` in the workspace: the agent's programs).
    cmd.env("PATH", PATH);
    if let Some(v) = std::env::var_os("HOME") {
        cmd.env("HOME", v);
    }
    cmd.envs(env)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| SecretCmdError::Spawn {
        prog: prog.clone(),
        source,
    })?;
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + limit;
    let mut out = child.stdout.take().ok_or(SecretCmdError::NoStdout)?;
    let read = read_until(&mut out, deadline);
    // Waited for without reaping it: its pid (the group's id) stays its own
    // until the group is killed, so the kill cannot reach a new process.
    let exited = loop {
        use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pgid), flags) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) | Err(_) => break false,
            Ok(_) => break true,
        }
    };
    // The whole group, always: what it left running ends with it.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let status = child.wait().ok().filter(|_| exited);
    let Some(status) = status else {
        return Err(SecretCmdError::Timeout {
            prog: prog.clone(),
            secs: limit.as_secs(),
        });
    };
    let buf = read?;
    if !status.success() {
        return Err(SecretCmdError::Failed {
            prog: prog.clone(),
            status,
        });
    }
    Ok(buf)
}

/// Reads `r` to its end, until `deadline`, at most [`MAX_OUT`] bytes.
fn read_until(
    r: &mut std::process::ChildStdout,
    deadline: Instant,
) -> Result<Vec<u8>, SecretCmdError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [nix::libc::pollfd {
            fd: r.as_raw_fd(),
            events: nix::libc::POLLIN,
            revents: 0,
        }];
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { nix::libc::poll(fds.as_mut_ptr(), 1, ms) };
        if n == 0 {
            return Err(SecretCmdError::OutputLate);
        }
        if n < 0 {
            continue;
        }
        match r.read(&mut chunk) {
            Ok(0) => return Ok(buf),
            Ok(k) if buf.len() + k > MAX_OUT => return Err(SecretCmdError::OutputLarge),
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SecretCmdError::Read(e)),
        }
    }
}

/// The value and its lifetime in a command's output: a JSON object (an
/// OAuth token response: `access_token`, or `value`, and `expires_in` in
/// seconds), or else the first line, which lives `lifetime` (the profile's
/// `lifetime_seconds`; None: until a 401 says otherwise).
pub(crate) fn parse(
    out: &[u8],
    lifetime: Option<u64>,
) -> Result<(Vec<u8>, Option<Duration>), SecretCmdError> {
    let t = out.trim_ascii();
    if t.starts_with(b"{") {
        let v: serde_json::Value =
            serde_json::from_slice(t).map_err(|_| SecretCmdError::NotJson)?;
        let value = ["access_token", "value"]
            .iter()
            .find_map(|k| v.get(k).and_then(|x| x.as_str()))
            .ok_or(SecretCmdError::NoValue)?;
        let life = match v.get("expires_in") {
            None => lifetime,
            Some(e) => Some(
                e.as_f64()
                    .filter(|s| *s >= 1.0)
                    .map(|s| s as u64)
                    .ok_or(SecretCmdError::ExpiresIn)?,
            ),
        };
        return Ok((value.as_bytes().to_vec(), life.map(bounded)));
    }
    let first = t.split(|b| *b == b'\n').next().unwrap_or_default();
    Ok((first.trim_ascii().to_vec(), lifetime.map(bounded)))
}

/// `secs` within [`LIFETIME`].
fn bounded(secs: u64) -> Duration {
    Duration::from_secs(secs.clamp(LIFETIME.0, LIFETIME.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_oauth_outputs() {
        let (v, l) = parse(b"abc-token-1\nignored\n", Some(60)).unwrap();
        assert_eq!(
            (v.as_slice(), l),
            (&b"abc-token-1"[..], Some(Duration::from_secs(60)))
        );
        let j = br#"{"access_token":"at-123456","token_type":"Bearer","expires_in":3600}"#;
        let (v, l) = parse(j, None).unwrap();
        assert_eq!(
            (v.as_slice(), l),
            (&b"at-123456"[..], Some(Duration::from_secs(3600)))
        );
        assert!(parse(br#"{"token":"x"}"#, None).is_err());
        assert!(parse(br#"{"value":"x","expires_in":"soon"}"#, None).is_err());
    }

    #[test]
    fn a_hanging_command_is_killed_with_its_group() {
        let d = tempfile::tempdir().unwrap();
        let pid = d.path().join("pid");
        let script = format!("sleep 100 & echo $! > {}; wait", pid.display());
        let argv = ["/bin/sh", "-c", &script].map(String::from);
        let t = Instant::now();
        let e = run(&argv, &BTreeMap::new(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, SecretCmdError::Timeout { secs: 1, .. }), "{e}");
        assert!(e.to_string().contains("did not finish within 1 s"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
        let p: i32 = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_err()
            || std::fs::read_to_string(format!("/proc/{p}/stat"))
                .unwrap_or_default()
                .contains(") Z");
        assert!(gone, "the group's sleep {p} still runs");
        let env = BTreeMap::from([("X".to_string(), "y".to_string())]);
        let argv = ["/bin/sh", "-c", "echo $X; env | wc -l"].map(String::from);
        let out = run(&argv, &env, Duration::from_secs(5)).unwrap();
        assert!(out.starts_with(b"y\n"), "{out:?}");
        let argv = ["/bin/sh", "-c", "exit 3"].map(String::from);
        let e = run(&argv, &env, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, SecretCmdError::Failed { .. }), "{e}");
        assert!(e.to_string().contains("failed"), "{e}");
    }
}

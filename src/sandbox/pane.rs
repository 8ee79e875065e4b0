//! The pane gate: `/run/sandmux/bin/sandmux-pane`, tmux's `default-shell`.
//!
//! tmux runs the gate for every pane it spawns: as a login shell
//! (`-sandmux-pane`, answered with an interactive shell), with a shell command
//! (`sandmux-pane -c CMD`), or — when
//! sandmux itself routes an argv-form command through it —
//! `sandmux-pane --exec -- ARGV...`. The gate:
//!
//! 1. reads its configuration from `gate.json` beside tmux's socket directory
//!    (`/run/sandmux/gate.json` in the mount view, the host view's without one;
//!    written by PID 1): its part of the sandbox's compiled blueprint
//!    (`plan::GateConfig`), the same value PID 1 acts on, for the view
//!    its files are in;
//! 2. rebuilds the environment: what tmux passes (the sandbox's own, already
//!    reduced to the profile's allowlist, plus variables sandmux's tools set
//!    after checking them) minus `TMUX`, `TMUX_PANE`, loader and session-bus
//!    variables, plus the profile's `set` entries;
//! 3. adds a Landlock layer nested under the server's, with the signal and
//!    abstract-socket scopes, so the pane can neither signal nor ptrace the tmux
//!    server or PID 1, and sees nothing of `/run/sandmux` but this binary;
//! 4. execs the shell or command. The interactive shell is not a login shell:
//!    a login shell would read `/etc/profile`, which replaces the profile's
//!    `PATH` and can export more than its allowlist.
//!
//! The socket directory is already covered for every process inside (PID 1 hid
//! it once the server listened; without a mount view it is root's 0700), and
//! the sandbox seccomp filter already forbids
//! new namespaces and mounts, so the gate needs no privilege of its own.

use super::plan::GateConfig;
use super::{env, landlock};
use crate::profile::Layer;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

/// Path of the gate inside the sandbox.
pub(crate) const GATE_PATH: &str = "/run/sandmux/bin/sandmux-pane";
/// Basename the binary recognises as the gate.
pub(crate) const GATE_NAME: &str = "sandmux-pane";
const CONFIG: &str = "/run/sandmux/gate.json";

/// Where the gate's configuration is: beside the socket directory that
/// `TMUX` names (`<dir>/sock/tmux.sock` → `<dir>/gate.json`). tmux sets
/// `TMUX` for every pane it spawns after the session's environment, so no
/// tool can change it; without it, the mount view's. Whoever runs the gate
/// is already inside the sandbox: a configuration of its own choosing can
/// only add a Landlock layer to what confines it.
fn config_path() -> std::path::PathBuf {
    let tmux = std::env::var_os("TMUX").unwrap_or_default();
    let sock = tmux
        .as_bytes()
        .split(|b| *b == b',')
        .next()
        .unwrap_or_default();
    std::path::Path::new(std::ffi::OsStr::from_bytes(sock))
        .parent()
        .and_then(|d| d.parent())
        .filter(|d| d.is_absolute())
        .map(|d| d.join("gate.json"))
        .unwrap_or_else(|| CONFIG.into())
}

/// The shell function `run_command` types its commands through, exported to
/// bash (and the bash shells it starts) through the environment. It runs the
/// command as data in the interactive shell (`eval`, so `cd` and `export`
/// persist and no quote in it can swallow what follows) between two markers
/// that are OSC sequences: they reach sandmux's `%output` stream, and tmux
/// draws nothing for them, so neither the screen nor a capture shows them.
/// An `EXIT` trap, set at the first command (the one fork it costs: the
/// shell's own `EXIT` trap is read then, and runs after sandmux's), prints
/// a third marker (`X`, with the status) should a command end the shell
/// (`exit 3`, `set -e` and a failure), then waits 0.2 s so tmux reads it
/// before it closes the pane (what a pane prints as it ends can otherwise
/// be lost). Outside a command it does nothing of its own. A command that
/// sets an `EXIT` trap of its own replaces it: a later `exit` then reports
/// no status.
pub(crate) const RUN_FUNCTION: &str = r#"() { printf '\033]6973;B%s;%s\007' "$1" "$$"; __sandmux_n=$1; __sandmux_c=$2; shift 2; if [ -z "${__sandmux_x-}" ]; then __sandmux_x=$(trap -p EXIT); eval "set -- $__sandmux_x"; __sandmux_u=${3-}; trap '__sandmux_s=$?; if [ -n "${__sandmux_n-}" ]; then printf "\033]6973;X%s;%s\007" "$__sandmux_n" "$__sandmux_s"; command sleep 0.2 2>/dev/null; fi; eval "${__sandmux_u-}"' EXIT; __sandmux_x=${__sandmux_x:-none}; fi; eval "$__sandmux_c"; set -- "$?"; printf '\033]6973;E%s;%s\007' "$__sandmux_n" "$1"; unset __sandmux_n __sandmux_c; return "$1"; }"#;
/// The environment variable bash imports [`RUN_FUNCTION`] from, as `__sandmux_run`.
pub(crate) const RUN_FUNCTION_ENV: &str = "BASH_FUNC___sandmux_run%%";
/// Run from `PROMPT_COMMAND`: a marker with the shell's pid and `$?` before
/// every prompt, so a command that never printed its end marker (C-c aborts
/// the whole function) is seen to be over when its shell prompts again.
pub(crate) const PROMPT_FUNCTION: &str =
    r#"() { set -- "$?"; printf '\033]6973;P%s;%s\007' "$$" "$1"; return "$1"; }"#;
/// The environment variable bash imports [`PROMPT_FUNCTION`] from.
pub(crate) const PROMPT_FUNCTION_ENV: &str = "BASH_FUNC___sandmux_prompt%%";

/// Adds the functions above to a pane's environment (`PROMPT_COMMAND` runs
/// `__sandmux_prompt` first, then whatever the profile set).
fn add_run_functions(env: &mut Vec<(OsString, OsString)>) {
    let prompt = env
        .iter()
        .find(|(k, _)| k == "PROMPT_COMMAND")
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .filter(|v| !v.contains("__sandmux_prompt"));
    let names = [RUN_FUNCTION_ENV, PROMPT_FUNCTION_ENV, "PROMPT_COMMAND"];
    env.retain(|(k, _)| !names.iter().any(|n| k.as_bytes() == n.as_bytes()));
    env.push((RUN_FUNCTION_ENV.into(), RUN_FUNCTION.into()));
    env.push((PROMPT_FUNCTION_ENV.into(), PROMPT_FUNCTION.into()));
    let pc = match prompt {
        Some(p) if !p.is_empty() => format!("__sandmux_prompt; {p}"),
        _ => "__sandmux_prompt".into(),
    };
    env.push(("PROMPT_COMMAND".into(), pc.into()));
}

/// What the gate was asked to run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// An interactive shell (tmux asks for a login shell; the pane gets the
    /// profile's environment instead of `/etc/profile`'s).
    Interactive,
    /// `shell -c CMD`.
    Command(OsString),
    /// An argv, exec'd directly (after the gate).
    Exec(Vec<OsString>),
    /// The live probe of `sandmux check`.
    Probe,
}

/// The gate was called with arguments it does not take.
#[derive(Debug, thiserror::Error)]
#[error("usage: sandmux-pane [-c COMMAND | --exec -- ARGV... | --probe]")]
pub(crate) struct UsageError;

/// Parses the gate's argv (including argv[0]).
pub(crate) fn parse(args: &[OsString]) -> Result<Request, UsageError> {
    let rest = &args[1.min(args.len())..];
    match rest.first().map(|a| a.as_bytes()) {
        None => Ok(Request::Interactive),
        Some(b"-c") if rest.len() == 2 => Ok(Request::Command(rest[1].clone())),
        Some(b"--exec") if rest.len() >= 3 && rest[1] == "--" => {
            Ok(Request::Exec(rest[2..].to_vec()))
        }
        Some(b"--probe") if rest.len() == 1 => Ok(Request::Probe),
        _ => Err(UsageError),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("sandmux-pane: {msg}");
    std::process::exit(126)
}

/// The pane's environment, as the gate rebuilt it.
type Env = [(OsString, OsString)];

/// Entry point when the binary runs as the gate. Never returns.
pub(crate) fn main(args: Vec<OsString>) -> ! {
    let req = parse(&args).unwrap_or_else(|e| fail(&e.to_string()));
    let cfg = read_config();
    let mut env = env::gate(&cfg.environment, std::env::vars_os());
    if !matches!(req, Request::Probe) {
        add_run_functions(&mut env);
    }
    confine(&cfg);
    let (prog, argv) = program(&cfg, req, &env);
    exec(&prog, &argv, &env)
}

/// Step 1: the gate's configuration, or the gate stops.
fn read_config() -> GateConfig {
    let config = config_path();
    let at = config.display();
    let text = std::fs::read(&config).unwrap_or_else(|e| fail(&format!("cannot read {at}: {e}")));
    serde_json::from_slice(&text).unwrap_or_else(|e| fail(&format!("bad {at}: {e}")))
}

/// Step 3: the pane's Landlock layer; a required layer the kernel lacks
/// stops the gate.
fn confine(cfg: &GateConfig) {
    let pane_rules = cfg.pane_rules();
    let best_effort = &cfg.best_effort;
    // TCP rules, when needed, are already in the server's layer, which panes inherit.
    match landlock::restrict(cfg.landlock_abi, &cfg.net, &pane_rules, true) {
        Ok(o) => {
            for (l, why) in o.missing {
                if !best_effort.contains(&l) {
                    fail(&format!("required layer {l} unavailable: {why}"));
                }
            }
        }
        Err((l, why))
            if !best_effort.contains(&l)
                || l == Layer::Landlock && !best_effort.contains(&Layer::LandlockScope) =>
        {
            fail(&format!("required layer {l} unavailable: {why}"))
        }
        Err(_) => {}
    }
}

/// What to exec for the request: the program and its argv. The probe runs
/// here and never returns.
fn program(cfg: &GateConfig, req: Request, env: &Env) -> (OsString, Vec<OsString>) {
    let shell = OsString::from(&cfg.identity.shell);
    match req {
        Request::Interactive => {
            let base = std::path::Path::new(&shell)
                .file_name()
                .unwrap_or_default()
                .to_os_string();
            (shell.clone(), vec![base, "-i".into()])
        }
        Request::Command(cmd) => (shell.clone(), vec![shell.clone(), "-c".into(), cmd]),
        Request::Exec(argv) => (argv[0].clone(), argv),
        Request::Probe => probe(cfg, env),
    }
}

/// The live probe of `sandmux check`, in the pane's environment.
fn probe(cfg: &GateConfig, env: &Env) -> ! {
    // SAFETY-free: replace our environment with the pane's, then probe in-process.
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    super::observe::run_and_print(cfg);
    // Stay until the reader kills the pane: a pane that exits at once can lose
    // its last output. The alarm bounds the wait if nobody does.
    // SAFETY: alarm(2) takes an integer only.
    unsafe { libc::alarm(60) };
    let mut sink = [0u8; 64];
    while std::io::Read::read(&mut std::io::stdin(), &mut sink)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    std::process::exit(0);
}

/// Step 4: execs `prog` with `argv` and the pane's environment (`PATH`
/// searched when `prog` has no `/`).
fn exec(prog: &OsString, argv: &[OsString], env: &Env) -> ! {
    let c = |s: &OsString| {
        CString::new(s.as_bytes()).unwrap_or_else(|_| fail("argument contains a NUL byte"))
    };
    let args: Vec<CString> = argv.iter().map(c).collect();
    let envp: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).unwrap_or_else(|_| fail("environment contains a NUL byte"))
        })
        .collect();
    if let Some((_, p)) = env.iter().find(|(k, _)| k == "PATH") {
        std::env::set_var("PATH", p);
    }
    let e = if prog.as_bytes().contains(&b'/') {
        nix::unistd::execve(&c(prog), &args, &envp).unwrap_err()
    } else {
        nix::unistd::execvpe(&c(prog), &args, &envp).unwrap_err()
    };
    fail(&format!("cannot run {prog:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses() {
        assert_eq!(parse(&v(&["-sandmux-pane"])).unwrap(), Request::Interactive);
        assert_eq!(
            parse(&v(&["sandmux-pane", "-c", "ls"])).unwrap(),
            Request::Command("ls".into())
        );
        assert_eq!(
            parse(&v(&["x", "--exec", "--", "a", "b"])).unwrap(),
            Request::Exec(v(&["a", "b"]))
        );
        assert!(parse(&v(&["x", "--exec", "a"])).is_err());
        assert!(parse(&v(&["x", "-c"])).is_err());
    }
}

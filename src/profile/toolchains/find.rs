//! Where each toolchain's installer puts it, in the order looked at; the
//! caller's variables first (`RUSTUP_HOME`, `PYENV_ROOT`, `NVM_DIR`,
//! `GOROOT`, …), then the installer's default under `$HOME`, then the
//! tool's binary on the caller's `PATH` when it resolves under /usr or /opt. Every directory is resolved
//! (rustup's toolchain directories may be symlinks).

use super::{in_home, perm, Found, Host, Toolchain, ToolchainError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Finds `name` on the host.
pub(super) fn find(name: Toolchain, host: &Host<'_>) -> Result<Found, ToolchainError> {
    let mut searched = Vec::new();
    let found = match name {
        Toolchain::Rust => rust(host, &mut searched)?,
        Toolchain::Python => python(host, &mut searched)?,
        Toolchain::Node => node(host, &mut searched)?,
        Toolchain::Go => go(host, &mut searched)?,
    };
    let binary = match name {
        Toolchain::Rust => "rustc",
        Toolchain::Python => "python3",
        Toolchain::Node => "node",
        Toolchain::Go => "go",
    };
    match found {
        Some(f) => Ok(f),
        None => match on_path(binary, host, &mut searched)? {
            Some(f) => Ok(f),
            None => Err(ToolchainError::NotFound {
                name,
                searched: format!("looked at {}", searched.join(", ")),
                fix: fix(name).into(),
            }),
        },
    }
}

/// How to point sandmux at an install of `name`.
pub(super) fn fix(name: Toolchain) -> &'static str {
    match name {
        Toolchain::Rust => "set RUSTUP_HOME to a rustup install (RUSTUP_TOOLCHAIN picks a toolchain), or install it under /usr or /opt and put it on PATH",
        Toolchain::Python => "set PYENV_ROOT to a pyenv install (PYENV_VERSION picks a version) or UV_PYTHON_INSTALL_DIR to uv's pythons, or install it under /usr or /opt and put it on PATH",
        Toolchain::Node => "set NVM_DIR to an nvm install (NVM_BIN picks a version), or install it under /usr or /opt and put it on PATH",
        Toolchain::Go => "set GOROOT to a Go install, or install it under /usr or /opt and put it on PATH",
    }
}

/// `var`, else `$HOME/rel`, as the directory to look in (and said so).
fn place(host: &Host<'_>, var: &str, rel: &str, searched: &mut Vec<String>) -> Option<PathBuf> {
    let p = match host.get(var) {
        Some(v) => PathBuf::from(v),
        None => host.home()?.join(rel),
    };
    searched.push(format!("{var}={}", p.display()));
    Some(p)
}

/// Whether `p` exists; a lookup the caller may not make is the error
/// naming the directory in the way.
fn present(name: Toolchain, p: &Path, host: &Host<'_>) -> Result<bool, ToolchainError> {
    match std::fs::metadata(p) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let (path, why) = perm::denied(p, &host.who);
            Err(ToolchainError::Unreadable {
                name,
                path: path.display().to_string(),
                uid: host.who.uid,
                why,
                fix: fix(name).into(),
            })
        }
        Err(_) => Ok(false),
    }
}

/// `dir/want`, else the newest `dir/want-*` or `dir/want.*` (a short name:
/// `stable` for `stable-x86_64-…`, `3.12` for `3.12.4`); `want` empty:
/// the newest of `dir` whose name starts with `prefix`.
fn pick(dir: &Path, want: &str, prefix: &str) -> Option<PathBuf> {
    // One name of `dir`'s (a file or variable says which): never a path
    // that leaves it (`/elsewhere`, `..`).
    let one = std::path::Path::new(want).components().count() == 1
        && !want.contains('/')
        && want != ".."
        && want != ".";
    if !want.is_empty() && !one {
        return None;
    }
    if !want.is_empty() && dir.join(want).is_dir() {
        return Some(dir.join(want));
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            if want.is_empty() {
                n.starts_with(prefix)
            } else {
                n.strip_prefix(want)
                    .is_some_and(|r| r.starts_with(['-', '.']))
            }
        })
        .filter(|n| dir.join(n).is_dir())
        .collect();
    names.sort_by_key(|n| version_key(n));
    names.pop().map(|n| dir.join(n))
}

/// The numbers in a name, for "newest" (`3.9.1` < `3.12.0`).
fn version_key(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// `dir` resolved, with `bin/exe` in it; else `None` (and why, searched).
fn root_with(dir: &Path, exe: &str, searched: &mut Vec<String>) -> Option<PathBuf> {
    let root = std::fs::canonicalize(dir).ok()?;
    if root.join("bin").join(exe).is_file() {
        return Some(root);
    }
    searched.push(format!("{} (no bin/{exe})", root.display()));
    None
}

/// "`from` → `to`" when a symlink was resolved, else the path.
fn said(from: &Path, to: &Path) -> String {
    if from == to {
        from.display().to_string()
    } else {
        format!("{} → {}", from.display(), to.display())
    }
}

/// rustup's toolchain, without rustup: its `bin` first on `PATH` (rustup's
/// proxies would read a `rust-toolchain.toml` and try to install), cargo's
/// home in the sandbox's home.
fn rust(host: &Host<'_>, searched: &mut Vec<String>) -> Result<Option<Found>, ToolchainError> {
    let Some(rh) = place(host, "RUSTUP_HOME", ".rustup", searched) else {
        return Ok(None);
    };
    if !present(Toolchain::Rust, &rh, host)? {
        return Ok(None);
    }
    let name = match host.get("RUSTUP_TOOLCHAIN") {
        Some(t) => t,
        None => default_toolchain(&rh).unwrap_or_default(),
    };
    if name.is_empty() {
        searched.push(format!(
            "{} (no default toolchain: `rustup default stable`, or set RUSTUP_TOOLCHAIN)",
            rh.join("settings.toml").display()
        ));
        return Ok(None);
    }
    let dir = rh.join("toolchains");
    let Some(tc) = pick(&dir, &name, "") else {
        searched.push(format!("{} (no toolchain {name:?})", dir.display()));
        return Ok(None);
    };
    let Some(root) = root_with(&tc, "rustc", searched) else {
        return Ok(None);
    };
    let cargo_home = in_home(".cargo");
    Ok(Some(Found {
        found: format!(
            "rustup (RUSTUP_HOME={}), toolchain {}",
            rh.display(),
            said(&tc, &root)
        ),
        path: vec![root.join("bin"), cargo_home.join("bin")],
        env: BTreeMap::from([("CARGO_HOME".into(), cargo_home.display().to_string())]),
        root,
    }))
}

/// `default_toolchain` of rustup's `settings.toml`.
fn default_toolchain(rustup_home: &Path) -> Option<String> {
    let text = std::fs::read_to_string(rustup_home.join("settings.toml")).ok()?;
    let t: toml::Table = toml::from_str(&text).ok()?;
    t.get("default_toolchain")?.as_str().map(str::to_string)
}

/// pyenv's version, else uv's newest CPython.
fn python(host: &Host<'_>, searched: &mut Vec<String>) -> Result<Option<Found>, ToolchainError> {
    if let Some(root) = place(host, "PYENV_ROOT", ".pyenv", searched) {
        if present(Toolchain::Python, &root, host)? {
            let v = host
                .get("PYENV_VERSION")
                .and_then(|v| v.split(':').next().map(str::to_string))
                .or_else(|| first_line(&root.join("version")))
                .unwrap_or_default();
            if v != "system" {
                let dir = root.join("versions");
                if let Some(f) = pick(&dir, &v, "").or_else(|| pick(&dir, "", "")) {
                    let what = format!("pyenv (PYENV_ROOT={}), version", root.display());
                    if let Some(f) = python_in(&f, &what, searched) {
                        return Ok(Some(f));
                    }
                }
            }
        }
    }
    if let Some(uv) = host.uv_pythons() {
        searched.push(format!("uv's pythons {}", uv.display()));
        if present(Toolchain::Python, &uv, host)? {
            if let Some(d) = pick(&uv, "", "cpython-") {
                return Ok(python_in(&d, "uv", searched));
            }
        }
    }
    Ok(None)
}

/// A Python installed in `dir`.
fn python_in(dir: &Path, what: &str, searched: &mut Vec<String>) -> Option<Found> {
    let root = root_with(dir, "python3", searched)?;
    Some(Found {
        found: format!("{what} {}", said(dir, &root)),
        path: vec![root.join("bin"), in_home(".local/bin")],
        env: BTreeMap::new(),
        root,
    })
}

/// The first non-empty line of a file.
fn first_line(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()?
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// nvm's active version (`NVM_BIN`), else its `default` alias, else its newest.
fn node(host: &Host<'_>, searched: &mut Vec<String>) -> Result<Option<Found>, ToolchainError> {
    let dir = if let Some(bin) = host.get("NVM_BIN") {
        searched.push(format!("NVM_BIN={bin}"));
        let bin = PathBuf::from(bin);
        if !present(Toolchain::Node, &bin, host)? {
            return Ok(None);
        }
        bin.parent().map(Path::to_path_buf)
    } else {
        let Some(nvm) = place(host, "NVM_DIR", ".nvm", searched) else {
            return Ok(None);
        };
        if !present(Toolchain::Node, &nvm, host)? {
            return Ok(None);
        }
        let alias = first_line(&nvm.join("alias/default")).unwrap_or_default();
        let want = match alias.trim_start_matches('v') {
            a if a.starts_with(|c: char| c.is_ascii_digit()) => format!("v{a}"),
            _ => String::new(),
        };
        let versions = nvm.join("versions/node");
        pick(&versions, &want, "v").or_else(|| pick(&versions, "", "v"))
    };
    let Some(dir) = dir else { return Ok(None) };
    let Some(root) = root_with(&dir, "node", searched) else {
        return Ok(None);
    };
    let prefix = in_home(".npm-global");
    Ok(Some(Found {
        found: format!("nvm, version {}", said(&dir, &root)),
        path: vec![root.join("bin"), prefix.join("bin")],
        env: BTreeMap::from([("NPM_CONFIG_PREFIX".into(), prefix.display().to_string())]),
        root,
    }))
}

/// `GOROOT`, else `/usr/local/go`.
fn go(host: &Host<'_>, searched: &mut Vec<String>) -> Result<Option<Found>, ToolchainError> {
    let dir = match host.get("GOROOT") {
        Some(g) => PathBuf::from(g),
        None => PathBuf::from("/usr/local/go"),
    };
    searched.push(format!("GOROOT={}", dir.display()));
    if !present(Toolchain::Go, &dir, host)? {
        return Ok(None);
    }
    Ok(root_with(&dir, "go", searched).map(|root| go_found(&dir, root)))
}

/// A Go root as lent: modules, builds and installs in the sandbox's home,
/// no toolchain downloads.
fn go_found(dir: &Path, root: PathBuf) -> Found {
    let gopath = in_home("go");
    let env = [
        ("GOROOT", root.display().to_string()),
        ("GOPATH", gopath.display().to_string()),
        ("GOMODCACHE", gopath.join("pkg/mod").display().to_string()),
        ("GOCACHE", in_home(".cache/go-build").display().to_string()),
        ("GOTOOLCHAIN", "local".into()),
    ];
    Found {
        found: format!("GOROOT {}", said(dir, &root)),
        path: vec![root.join("bin"), gopath.join("bin")],
        env: env.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        root,
    }
}

/// `exe` on the caller's `PATH`, resolved; its root is the directory above
/// its `bin`.
fn on_path(
    exe: &str,
    host: &Host<'_>,
    searched: &mut Vec<String>,
) -> Result<Option<Found>, ToolchainError> {
    let path = host.get("PATH").unwrap_or_default();
    searched.push(format!("{exe} on PATH ({path})"));
    let mut seen = Vec::new();
    for d in path.split(':').filter(|d| d.starts_with('/')) {
        if seen.contains(&d) {
            continue;
        }
        seen.push(d);
        let p = Path::new(d).join(exe);
        let real = match std::fs::canonicalize(&p) {
            Ok(real) => real,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                let (_, why) = perm::denied(&p, &host.who);
                searched.push(format!("{} (not searched: {why})", p.display()));
                continue;
            }
            Err(_) => continue,
        };
        // Only a system install (under /usr or /opt, owned by whoever
        // installs for the machine): a PATH entry the agent can write (a
        // workspace's `.venv/bin`) must not choose what is lent.
        let named = real
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(exe));
        let system = real.starts_with("/usr/") || real.starts_with("/opt/");
        let (Some(bin), true) = (real.parent(), real.is_file() && named && system) else {
            if real.is_file() && !(named && system) {
                searched.push(format!(
                    "{} → {} (not lent: only a {exe} under /usr or /opt is taken from PATH)",
                    p.display(),
                    real.display()
                ));
            }
            continue;
        };
        if bin.file_name() != Some(std::ffi::OsStr::new("bin")) {
            continue;
        }
        let Some(root) = bin.parent().filter(|r| *r != Path::new("/")) else {
            continue;
        };
        let found = format!("{exe} on PATH: {}", said(&p, &real));
        let mut f = Found {
            found,
            root: root.to_path_buf(),
            path: vec![bin.to_path_buf()],
            env: BTreeMap::new(),
        };
        if exe == "go" {
            let go = go_found(root, root.to_path_buf());
            f.env = go.env;
            f.path = go.path;
        }
        return Ok(Some(f));
    }
    Ok(None)
}

//! Finding and lending toolchains in made-up install trees.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

fn exe(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn host<'a>(var: &'a dyn Fn(&str) -> Option<String>) -> Host<'a> {
    Host {
        var,
        who: perm::Who::caller(),
    }
}

fn lend_one(t: Toolchain, vars: &[(&str, &Path)]) -> Result<Lent, ToolchainError> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.display().to_string()))
        .collect();
    let var = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let ws = Path::new("/nonexistent-workspace");
    lend(&[t, t], &[], ws, &host(&var)).map(|mut v| {
        assert_eq!(v.len(), 1, "a name asked twice is lent once");
        v.remove(0)
    })
}

#[test]
fn rustup_toolchain_symlinks_are_resolved_and_cargo_home_stays_out() {
    let d = tempfile::tempdir().unwrap();
    let rh = d.path().join("rustup");
    let real = rh.join("toolchains/stable-x86_64-unknown-linux-gnu");
    exe(&real.join("bin/rustc"));
    symlink(&real, rh.join("toolchains/1.95.0-x86_64-unknown-linux-gnu")).unwrap();
    std::fs::write(
        rh.join("settings.toml"),
        "default_toolchain = \"1.95.0-x86_64-unknown-linux-gnu\"\n",
    )
    .unwrap();
    let cargo = d.path().join("cargo");
    std::fs::create_dir_all(&cargo).unwrap();
    std::fs::write(cargo.join("credentials.toml"), "token").unwrap();
    let l = lend_one(
        Toolchain::Rust,
        &[("RUSTUP_HOME", &rh), ("CARGO_HOME", &cargo)],
    )
    .unwrap();
    let real = std::fs::canonicalize(real).unwrap();
    assert_eq!(l.paths, vec![real.clone()]);
    assert_eq!(l.env["CARGO_HOME"], "/home/sandmux/.cargo");
    assert!(l.env["PATH"].starts_with(&format!("{}/bin:", real.display())));
    assert!(l.found.contains("→"), "{}", l.found);
    // A short name finds the full one.
    let l = lend_one(
        Toolchain::Rust,
        &[
            ("RUSTUP_HOME", &rh),
            ("RUSTUP_TOOLCHAIN", Path::new("stable")),
        ],
    )
    .unwrap();
    assert_eq!(l.paths, vec![real]);
}

#[test]
fn a_missing_toolchain_says_what_was_searched_and_the_variable() {
    let d = tempfile::tempdir().unwrap();
    let e = lend_one(
        Toolchain::Rust,
        &[("RUSTUP_HOME", &d.path().join("none")), ("PATH", d.path())],
    )
    .unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("not found") && s.contains("RUSTUP_HOME=") && s.contains("set RUSTUP_HOME"),
        "{s}"
    );
    let e = lend_one(
        Toolchain::Go,
        &[("GOROOT", &d.path().join("none")), ("PATH", d.path())],
    )
    .unwrap_err();
    assert!(e.to_string().contains("set GOROOT"), "{e}");
}

#[test]
fn go_python_node_are_found_where_their_installers_put_them() {
    let d = tempfile::tempdir().unwrap();
    let go = d.path().join("go");
    exe(&go.join("bin/go"));
    let l = lend_one(Toolchain::Go, &[("GOROOT", &go)]).unwrap();
    assert_eq!(l.env["GOPATH"], "/home/sandmux/go");
    assert_eq!(l.env["GOTOOLCHAIN"], "local");
    let py = d.path().join("pyenv");
    exe(&py.join("versions/3.9.1/bin/python3"));
    exe(&py.join("versions/3.12.4/bin/python3"));
    let l = lend_one(Toolchain::Python, &[("PYENV_ROOT", &py)]).unwrap();
    assert!(
        l.found.contains("3.12.4"),
        "the newest without a version file: {}",
        l.found
    );
    std::fs::write(py.join("version"), "3.9\n").unwrap();
    let l = lend_one(Toolchain::Python, &[("PYENV_ROOT", &py)]).unwrap();
    assert!(l.found.contains("3.9.1"), "{}", l.found);
    let nvm = d.path().join("nvm");
    exe(&nvm.join("versions/node/v18.2.0/bin/node"));
    exe(&nvm.join("versions/node/v20.11.1/bin/node"));
    std::fs::create_dir_all(nvm.join("alias")).unwrap();
    std::fs::write(nvm.join("alias/default"), "18\n").unwrap();
    let l = lend_one(Toolchain::Node, &[("NVM_DIR", &nvm)]).unwrap();
    assert!(l.found.contains("v18.2.0"), "{}", l.found);
    assert_eq!(l.env["NPM_CONFIG_PREFIX"], "/home/sandmux/.npm-global");
}

#[test]
fn a_directory_with_credentials_or_a_home_is_not_lent() {
    let d = tempfile::tempdir().unwrap();
    let go = d.path().join("go");
    exe(&go.join("bin/go"));
    std::fs::write(go.join(".netrc"), "machine x").unwrap();
    let e = lend_one(Toolchain::Go, &[("GOROOT", &go)]).unwrap_err();
    assert!(e.to_string().contains("holds .netrc"), "{e}");
    let home = d.path().join("home");
    exe(&home.join("bin/node"));
    let e = lend_one(
        Toolchain::Node,
        &[("HOME", &home), ("NVM_BIN", &home.join("bin"))],
    )
    .unwrap_err();
    assert!(e.to_string().contains("home directory"), "{e}");
}

#[test]
fn an_unreadable_toolchain_names_the_path_the_uid_and_the_fix() {
    let d = tempfile::tempdir().unwrap();
    let go = d.path().join("go");
    exe(&go.join("bin/go"));
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let var = |k: &str| (k == "GOROOT").then(|| go.display().to_string());
    let who = perm::Who {
        uid: 4242,
        gids: vec![4242],
    };
    let h = Host { var: &var, who };
    let e = lend(&[Toolchain::Go], &[], Path::new("/nonexistent"), &h).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("uid 4242") && s.contains("mode 0700") && s.contains("set GOROOT"),
        "{s}"
    );
}

#[test]
fn names_are_checked_and_listed() {
    let e = "ruby".parse::<Toolchain>().unwrap_err();
    assert!(matches!(e, ToolchainError::Unknown { .. }), "{e}");
    assert!(e.to_string().contains("rust, python, node, go"), "{e}");
    let mut fs = vec![];
    let mut set = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
    let l = Lent {
        name: Toolchain::Go,
        found: String::new(),
        paths: vec!["/opt/go".into()],
        visible: vec![],
        env: BTreeMap::from([("PATH".into(), "/opt/go/bin:/usr/bin".into())]),
    };
    let mut lent = [l.clone(), l];
    lent[1].name = Toolchain::Rust;
    apply(&mut lent, &mut fs, &mut set);
    assert_eq!(set["PATH"], "/opt/go/bin:/usr/bin:/bin");
    assert_eq!(fs.len(), 1);
    // The report says what was prepended: nothing the PATH had already.
    assert_eq!(lent[0].env["PATH"], "/opt/go/bin");
    assert!(!lent[1].env.contains_key("PATH"));
}

/// uv's pythons where `find` looks when `UV_PYTHON_INSTALL_DIR` is unset:
/// `$XDG_DATA_HOME/uv/python`. In the workspace, they are refused like
/// the other toolchain homes (the agent writes them).
#[test]
fn uv_pythons_under_xdg_data_home_in_the_workspace_are_refused() {
    let ws = tempfile::tempdir().unwrap();
    let data = ws.path().join("share");
    exe(&data.join("uv/python/cpython-3.12.1-linux-x86_64-gnu/bin/python3"));
    let vars = [("XDG_DATA_HOME", data.display().to_string())];
    let var = move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let e = lend(&[Toolchain::Python], &[], ws.path(), &host(&var)).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("XDG_DATA_HOME") && s.contains("workspace"),
        "{s}"
    );
    // Outside the workspace the same variable is only where uv looks.
    let other = tempfile::tempdir().unwrap();
    let e = lend(&[Toolchain::Python], &[], other.path(), &host(&var));
    assert!(
        e.as_ref()
            .err()
            .is_none_or(|e| !e.to_string().contains("lies in the workspace")),
        "{e:?}"
    );
}

//! Profile parsing and resolution.

use super::*;

#[test]
fn builtins_parse() {
    for (name, text) in BUILTINS {
        parse(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn unknown_key_names_line_and_key() {
    let text = "version = 1\ndescription = \"x\"\n[network]\nmode = \"none\"\nbogus = 3\n";
    let err = parse("p.toml", text).unwrap_err().to_string();
    assert!(err.contains("p.toml"), "{err}");
    assert!(err.contains("line 5"), "{err}");
    assert!(err.contains("bogus"), "{err}");
}

#[test]
fn wrong_type_is_reported() {
    let text = "version = 1\ndescription = \"x\"\n[limits]\nnofile = \"many\"\n";
    let err = parse("p.toml", text).unwrap_err().to_string();
    assert!(err.contains("line 4") && err.contains("nofile"), "{err}");
}

#[test]
fn bad_version_and_sizes() {
    let err = parse("p.toml", "version = 2\ndescription = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`version`") && err.contains("line 1"), "{err}");
    let err = parse(
        "p.toml",
        "version = 1\ndescription = \"x\"\n[limits]\nmemory = \"4 lots\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("memory") && err.contains("line 4") && err.contains("lots"),
        "{err}"
    );
}

#[test]
fn session_and_pane_limits_are_bounded() {
    let with = |body: &str| format!("version = 1\ndescription = \"x\"\n[limits]\n{body}\n");
    for (body, key, reason) in [
        ("max_sessions = 0", "limits.max_sessions", "outside 1-256"),
        ("max_sessions = 257", "limits.max_sessions", "outside 1-256"),
        ("max_panes = 0", "limits.max_panes", "outside 1-4096"),
        ("max_panes = 5000", "limits.max_panes", "outside 1-4096"),
        (
            "max_sessions = 8\nmax_panes = 4",
            "limits.max_panes",
            "below max_sessions",
        ),
    ] {
        let err = parse("p.toml", &with(body)).unwrap_err().to_string();
        assert!(
            err.contains("p.toml") && err.contains(key) && err.contains(reason),
            "{body}: {err}"
        );
    }
    let err = parse("p.toml", &with("max_sessions = -1"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 4") && err.contains("max_sessions"),
        "{err}"
    );
    let p = parse("p.toml", &with("max_sessions = 3\nmax_panes = 5")).unwrap();
    assert_eq!((p.limits.max_sessions, p.limits.max_panes), (3, 5));
    let d = parse("p.toml", &with("")).unwrap();
    assert_eq!((d.limits.max_sessions, d.limits.max_panes), (16, 128));
    for (name, text) in BUILTINS {
        let b = parse(name, text).unwrap();
        assert_eq!(
            (b.limits.max_sessions, b.limits.max_panes),
            (16, 128),
            "{name}"
        );
    }
}

#[test]
fn recording_cap_is_a_size_with_a_minimum() {
    let text = "version = 1\ndescription = \"x\"\n[recording]\nmax_bytes = \"1KiB\"\n";
    let err = parse("p.toml", text).unwrap_err().to_string();
    assert!(
        err.contains("p.toml")
            && err.contains("recording.max_bytes")
            && err.contains("line 4")
            && err.contains("4KiB"),
        "{err}"
    );
    let text = "version = 1\ndescription = \"x\"\n[recording]\nmax_bytes = \"8MiB\"\n";
    assert_eq!(
        parse("p.toml", text).unwrap().recording.max_bytes.0,
        8 << 20
    );
    let p = parse("p.toml", "version = 1\ndescription = \"x\"\n").unwrap();
    assert_eq!(p.recording.max_bytes.0, 64 << 20);
    for (name, text) in BUILTINS {
        let p = parse(name, text).unwrap();
        assert_eq!(p.recording.max_bytes.0, 64 << 20, "{name}");
    }
}

#[test]
fn unknown_layer_and_toolset_rejected() {
    let err = parse(
        "p.toml",
        "version = 1\ndescription = \"x\"\n[enforcement]\nbest_effort = [\"landlok\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("landlok") && err.contains("line 4"), "{err}");
    let err = parse(
        "p.toml",
        "version = 1\ndescription = \"x\"\n[mcp]\ntoolsets = [\"evrything\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("evrything"), "{err}");
}

#[test]
fn missing_path_names_key() {
    let dir = tempfile::tempdir().unwrap();
    let ws = check_workspace(dir.path()).unwrap();
    let text =
        "version = 1\ndescription = \"x\"\n[filesystem]\nread_only = [\"/definitely/not/here\"]\n";
    let loaded = Loaded {
        name: "t".into(),
        source: Source::File("/etc/t.toml".into()),
        text: text.into(),
        profile: parse("t", text).unwrap(),
    };
    let err = loaded
        .resolve(&Context::of(ws, crate::guard::planner))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("filesystem.read_only")
            && err.contains("line 4")
            && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn symlinked_workspace_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = check_workspace(&link).unwrap_err();
    assert!(
        matches!(err, workspace::WorkspaceError::Symlink { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(check_workspace(&link.join(".")).is_err());
}

#[test]
fn workspace_under_sandbox_mounts_refused() {
    let err = check_workspace(Path::new("/dev/shm")).unwrap_err();
    assert!(err.to_string().contains("/dev"), "{err}");
    assert!(check_workspace(Path::new("/proc/self")).is_err());
}

#[test]
fn profile_inside_workspace_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ws = check_workspace(dir.path()).unwrap();
    let f = ws.join("evil.toml");
    std::fs::write(&f, BUILTINS[0].1).unwrap();
    let loaded = load_file(&f).unwrap();
    let err = loaded
        .resolve(&Context::of(ws, crate::guard::planner))
        .unwrap_err();
    assert!(matches!(err, ProfileError::InWorkspace { .. }));
}

#[test]
fn mount_order_parents_first() {
    let dir = tempfile::tempdir().unwrap();
    let ws = check_workspace(dir.path()).unwrap();
    let l = load("default").unwrap();
    let pol = l.resolve(&Context::of(ws, crate::guard::planner)).unwrap();
    let depths: Vec<usize> = pol.fs.iter().map(|e| e.path.components().count()).collect();
    let mut sorted = depths.clone();
    sorted.sort();
    assert_eq!(depths, sorted);
}

#[test]
fn proxy_keys_are_checked_and_named() {
    let base = "version = 1\ndescription = \"x\"\n[network]\n";
    let err = |net: &str| {
        parse("p.toml", &format!("{base}{net}"))
            .unwrap_err()
            .to_string()
    };
    let e = err("mode = \"loopback\"\nallow = [\"pypi.org\"]\n");
    assert!(
        e.contains("network.allow") && e.contains("only to mode = \"proxy\""),
        "{e}"
    );
    let e = err("mode = \"proxy\"\nallow = [\"10.0.0.1\"]\n");
    assert!(
        e.contains("network.allow") && e.contains("IP address"),
        "{e}"
    );
    let e = err("mode = \"proxy\"\nallow = [\"bücher.test\"]\n");
    assert!(e.contains("network.allow") && e.contains("punycode"), "{e}");
    let e = err("mode = \"proxy\"\nallow_private = [\"127.0.0.1/8\"]\n");
    assert!(e.contains("network.allow_private"), "{e}");
    let e = err("mode = \"proxy\"\nhosts = { \"a.test\" = \"nowhere\" }\n");
    assert!(
        e.contains("network.hosts") && e.contains("not an IP address"),
        "{e}"
    );
    let e = err("mode = \"proxy\"\nproxy_connections = 0\n");
    assert!(e.contains("network.proxy_connections"), "{e}");
    let ok = format!("{base}mode = \"proxy\"\nallow = [\"*.crates.io\", \"Mirror.Test.:8443\"]\nallow_private = [\"127.0.0.0/8\"]\nhosts = {{ \"mirror.test\" = \"127.0.0.1\" }}\n");
    let p = parse("p.toml", &ok).unwrap();
    assert_eq!(p.network.proxy_connections, 64);
    assert_eq!(p.network.proxy_idle_seconds, 30);
    assert_eq!(p.network.proxy_header_bytes, 16384);
}

/// A profile of `text` in a file outside `ws`.
fn loaded(text: &str) -> Loaded {
    Loaded {
        name: "t".into(),
        source: Source::File("/etc/t.toml".into()),
        text: text.into(),
        profile: parse("t", text).unwrap(),
    }
}

#[test]
fn a_read_only_symlink_points_at_its_resolved_target_which_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let ws = check_workspace(&ws).unwrap();
    let real = std::fs::canonicalize(dir.path()).unwrap().join("sdk-1.2");
    std::fs::create_dir(&real).unwrap();
    let link = dir.path().join("sdk");
    std::os::unix::fs::symlink("sdk-1.2", &link).unwrap();
    let text = format!(
        "version = 1\ndescription = \"x\"\n[filesystem]\nread_only = [\"/usr\", \"{}\"]\n",
        link.display()
    );
    let p = loaded(&text)
        .resolve(&Context::of(ws.clone(), crate::guard::planner))
        .unwrap();
    let kind = |path: &Path| p.fs.iter().find(|e| e.path == path).map(|e| e.kind.clone());
    assert_eq!(kind(&link), Some(MountKind::Symlink(real.clone())));
    assert_eq!(kind(&real), Some(MountKind::ReadOnly), "{:?}", p.fs);
    assert_eq!(p.links, vec![(link.clone(), real.clone())]);
    assert!(links_said(&p)[0].contains("bound read-only for it"));
    // A link whose target the view shows already is only the link.
    let usr_link = dir.path().join("share");
    std::os::unix::fs::symlink("/usr/share", &usr_link).unwrap();
    let text = text.replace("\"/usr\"", &format!("\"/usr\", \"{}\"", usr_link.display()));
    let p = loaded(&text)
        .resolve(&Context::of(ws.clone(), crate::guard::planner))
        .unwrap();
    assert!(!p.fs.iter().any(|e| e.path == Path::new("/usr/share")));
    // Read-write: refused, naming the target; dangling: refused unless optional.
    let rw = format!(
        "version = 1\ndescription = \"x\"\n[filesystem]\nread_write = [\"{}\"]\n",
        link.display()
    );
    let err = loaded(&rw)
        .resolve(&Context::of(ws.clone(), crate::guard::planner))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is a symlink to") && err.contains("never followed"),
        "{err}"
    );
    std::fs::remove_dir(&real).unwrap();
    let err = loaded(&text)
        .resolve(&Context::of(ws.clone(), crate::guard::planner))
        .unwrap_err()
        .to_string();
    assert!(err.contains("target cannot be resolved"), "{err}");
    let optional = text.replace(
        &format!("\"{}\"", link.display()),
        &format!("\"?{}\"", link.display()),
    );
    let p = loaded(&optional)
        .resolve(&Context::of(ws, crate::guard::planner))
        .unwrap();
    assert!(!p.fs.iter().any(|e| e.path == link));
}

#[test]
fn toolchains_parse_and_unknown_names_list_the_known() {
    let ok = "version = 1\ndescription = \"x\"\n[toolchains]\nlend = [\"rust\", \"go\"]\n";
    assert_eq!(
        parse("t", ok).unwrap().toolchains.lend,
        [Toolchain::Rust, Toolchain::Go]
    );
    let bad = ok.replace("\"go\"", "\"ruby\"");
    let err = parse("t", &bad).unwrap_err().to_string();
    assert!(
        err.contains("ruby") && err.contains("rust") && err.contains("go"),
        "{err}"
    );
}

/// Each section's defaults are written once, in its `Default`: a missing
/// key takes that value (`#[serde(default)]` on the section), and an
/// empty section is the `Default`.
#[test]
fn an_empty_section_is_its_default() {
    fn same<T: serde::de::DeserializeOwned + Default + std::fmt::Debug>(what: &str) {
        let parsed: T = toml::from_str("").unwrap();
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", T::default()),
            "{what}"
        );
    }
    same::<schema::Network>("network");
    same::<schema::Limits>("limits");
    same::<schema::SandboxSettings>("sandbox");
    same::<schema::McpSettings>("mcp");
    same::<schema::RecordingSettings>("recording");
    same::<user::KeptLayers>("kept layers");
    same::<user::AuditRetention>("audit retention");
    // One key given, the rest from the Default.
    let l: schema::Limits = toml::from_str("nofile = 99").unwrap();
    assert_eq!((l.nofile, l.processes, l.max_panes), (99, 512, 128));
}

#[test]
fn ask_toolsets_name_only_what_is_not_enabled() {
    let with = |body: &str| format!("version = 1\ndescription = \"x\"\n[mcp]\n{body}\n");
    let err = parse(
        "p.toml",
        &with("toolsets = [\"inspect\", \"execute\"]\nask_toolsets = [\"execute\"]"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("mcp.ask_toolsets") && err.contains("\"execute\" is enabled"),
        "{err}"
    );
    // Held until a grant (act = "on-grant"), execute may be asked for.
    parse(
        "p.toml",
        &with("toolsets = [\"inspect\", \"execute\"]\nact = \"on-grant\"\nask_toolsets = [\"execute\"]"),
    )
    .unwrap();
    parse("p.toml", &with("ask_toolsets = [\"teardown\"]")).unwrap();
    // dev asks for the teardown tools; the other built-ins ask for nothing.
    for (name, text) in BUILTINS {
        let b = parse(name, text).unwrap();
        let want: &[Toolset] = if *name == "dev" {
            &[Toolset::Teardown]
        } else {
            &[]
        };
        assert_eq!(b.mcp.ask_toolsets, want, "{name}");
    }
}

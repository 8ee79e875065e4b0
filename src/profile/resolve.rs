//! Profile resolution: a loaded profile and a workspace become the
//! [`Policy`] a sandbox is built from, step by step (the profile's place, its
//! protected names, its filesystem entries, the workspace guard).

use super::*;

impl Loaded {
    /// Resolves the profile for a workspace. Errors name the profile key.
    /// The steps: the profile's place, its protected names (checked before
    /// anything uses them), its filesystem entries, the workspace guard.
    pub(crate) fn resolve(&self, ctx: &Context) -> Result<Policy, ProfileError> {
        self.check_place(ctx)?;
        let p = &self.profile;
        let names = self.protected_names()?;
        let (mut fs, links) = self.fs_entries(ctx)?;
        let (mode, workspace_fallback) = self.workspace_mode(ctx);
        let (guard, ro) = self.plan_guard(ctx, &fs, names, mode)?;
        let mut environment = self.environment(ctx);
        let lent = self.lend_toolchains(ctx, &mut fs, &mut environment)?;
        Ok(Policy {
            name: self.name.clone(),
            source: self.source.clone(),
            description: p.description.clone(),
            fs,
            protected: ro.protected,
            guard,
            pinned: ro.pinned,
            network: p.network.clone(),
            limits: p.limits.clone(),
            environment,
            sandbox: p.sandbox.clone(),
            best_effort: p.enforcement.best_effort.iter().copied().collect(),
            landlock_abi: p.enforcement.landlock_abi,
            workspace: ctx.workspace.clone(),
            layer: None,
            workspace_mode: mode,
            workspace_fallback,
            on_end: ctx.on_end,
            layer_bound: (p.workspace.layer_bytes.0 .0, p.workspace.layer_files.0),
            history_bytes: p.workspace.history_bytes.0 .0,
            toolchains: lent,
            links,
            mcp: capped(&p.mcp, ctx.wait_cap),
            credentials: p.credentials.clone(),
            ca_pem: None,
            recording: p.recording.clone(),
        })
    }

    /// A profile file may not live inside the workspace it confines.
    fn check_place(&self, ctx: &Context) -> Result<(), ProfileError> {
        if let Source::File(p) = &self.source {
            if p.starts_with(&ctx.workspace) {
                return Err(ProfileError::InWorkspace {
                    file: self.source.to_string(),
                    workspace: ctx.workspace.display().to_string(),
                });
            }
        }
        Ok(())
    }

    /// The workspace guard of the read-write trees (`ctx.plan_guard`), with
    /// the read-only binds of the protected `names` in them.
    fn plan_guard(
        &self,
        ctx: &Context,
        fs: &[FsEntry],
        names: Vec<PathBuf>,
        mode: WorkspaceMode,
    ) -> Result<(guard::Guard, guard::ReadOnly), ProfileError> {
        let p = &self.profile;
        let cow = mode.has_door();
        if mode == WorkspaceMode::CopyOnWrite {
            self.check_layer_path(&ctx.workspace)?;
        }
        // A copy-on-write or copy workspace is not the host's tree inside:
        // nothing to guard there.
        let roots: Vec<PathBuf> = fs
            .iter()
            .filter(|e| e.kind == MountKind::ReadWrite)
            .filter(|e| !(cow && e.path == ctx.workspace))
            .map(|e| e.path.clone())
            .collect();
        let names = with_config_dir(names, &roots);
        // Commit mode is about the workspace's repository, which a
        // copy-on-write workspace keeps out of the guard's trees: said, not
        // quietly changed.
        if cow && p.workspace.git == GitMode::Commit {
            return Err(self.invalid(
                "workspace.git",
                "git = \"commit\" needs [workspace] mode = \"live\": a copy-on-write workspace already keeps the agent's commits in its layer, and `sandmux apply` brings them in as refs".into(),
            ));
        }
        (ctx.plan_guard)(
            &roots,
            &names,
            p.workspace.git,
            p.workspace.new_repositories,
        )
        .map_err(|reason| self.invalid("workspace.git", reason.to_string()))
    }

    /// `[environment]` with its values' placeholders filled in, and the
    /// proxy's variables when the proxy is the only way out.
    fn environment(&self, ctx: &Context) -> Environment {
        let p = &self.profile;
        let mut environment = p.environment.clone();
        for v in environment.set.values_mut() {
            *v = subst(ctx, v);
        }
        if p.network.mode == NetMode::Proxy {
            // The proxy is the only way out: every spelling tools read.
            environment.set.extend(super::allow::env_vars());
        }
        environment
    }

    /// The toolchains lent from the caller's host, added to the mounts and
    /// the environment.
    fn lend_toolchains(
        &self,
        ctx: &Context,
        fs: &mut Vec<FsEntry>,
        environment: &mut Environment,
    ) -> Result<Vec<toolchains::Lent>, ProfileError> {
        let var = |k: &str| std::env::var(k).ok();
        let host = toolchains::Host::of_caller(&var);
        let mut lent = toolchains::lend(&self.profile.toolchains.lend, fs, &ctx.workspace, &host)
            .map_err(|source| ProfileError::Toolchain {
            file: self.source.to_string(),
            source,
        })?;
        toolchains::apply(&mut lent, fs, &mut environment.set);
        Ok(lent)
    }

    /// The workspace's mode: `--workspace-mode`, else the profile's; a
    /// copy-on-write workspace the caller found impossible here is a copy
    /// (the same door, no mount needed) when the profile lets the mount
    /// layer go (and says why), else it stays, and the sandbox refuses to
    /// start naming the mount layer. Never live unless asked.
    fn workspace_mode(&self, ctx: &Context) -> (WorkspaceMode, Option<String>) {
        let mode = ctx.mode.unwrap_or(self.profile.workspace.mode);
        let lenient = self.profile.enforcement.best_effort.contains(&Layer::Mount);
        match &ctx.no_overlay {
            Some(why) if mode == WorkspaceMode::CopyOnWrite && lenient => (
                WorkspaceMode::Copy,
                Some(format!(
                    "a private copy, not copy-on-write: {why} (the profile lets the mount layer go; the agent works on a copy made at start, confined by Landlock, and `sandmux diff`/`apply` bring its changes in as from a layer; `--workspace-mode live` to work on your tree instead)"
                )),
            ),
            _ => (mode, None),
        }
    }

    /// Whether a copy-on-write workspace that cannot be had here would be
    /// a copy instead: only then is it worth looking ([`Context::no_overlay`]).
    pub(crate) fn may_fall_back(&self, ctx: &Context) -> bool {
        ctx.mode.unwrap_or(self.profile.workspace.mode) == WorkspaceMode::CopyOnWrite
            && self.profile.enforcement.best_effort.contains(&Layer::Mount)
    }

    /// An error at `key` of this profile.
    fn invalid(&self, key: &str, reason: String) -> ProfileError {
        ProfileError::Invalid {
            file: self.source.to_string(),
            line: line_of(&self.text, key),
            key: key.to_string(),
            reason,
        }
    }

    /// `[filesystem] protected`: relative paths without `..`.
    fn protected_names(&self) -> Result<Vec<PathBuf>, ProfileError> {
        let mut names = Vec::new();
        for rel in &self.profile.filesystem.protected {
            let rp = Path::new(rel);
            if rp.is_absolute()
                || rel.is_empty()
                || rp
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(self.invalid(
                    "filesystem.protected",
                    format!("{rel:?} must be a relative path without '..' (it is taken inside each read-write root)"),
                ));
            }
            names.push(rp.to_path_buf());
        }
        Ok(names)
    }

    /// The filesystem entries, checked, parents before children, and the
    /// read-only entries that are symlinks on the host with their targets.
    fn fs_entries(&self, ctx: &Context) -> Result<(Vec<FsEntry>, Links), ProfileError> {
        let f = &self.profile.filesystem;
        let groups: [(&str, &Vec<String>, MountKind); 4] = [
            ("filesystem.read_only", &f.read_only, MountKind::ReadOnly),
            ("filesystem.read_write", &f.read_write, MountKind::ReadWrite),
            ("filesystem.tmpfs", &f.tmpfs, MountKind::Tmpfs),
            ("filesystem.masked", &f.masked, MountKind::Masked),
        ];
        let mut fs: Vec<FsEntry> = Vec::new();
        let mut seen = BTreeSet::new();
        for (key, list, kind) in groups {
            for raw in list.iter() {
                if let Some(e) = self.fs_entry(ctx, key, raw, kind.clone(), &mut seen)? {
                    fs.push(e);
                }
            }
        }
        let links = self.lend_link_targets(&mut fs, &ctx.workspace)?;
        // Parents before children; stable for equal depth.
        fs.sort_by_key(|e| e.path.components().count());
        Ok((fs, links))
    }

    /// Each read-only entry that is a symlink on the host points, inside,
    /// at its resolved target, and that target is in the view: shown by
    /// another entry already (`/bin` → `/usr/bin`), else bound read-only
    /// itself. Never a dangling link inside.
    fn lend_link_targets(
        &self,
        fs: &mut Vec<FsEntry>,
        workspace: &Path,
    ) -> Result<Links, ProfileError> {
        let mut links = Vec::new();
        let mut added = Vec::new();
        for i in 0..fs.len() {
            let MountKind::Symlink(_) = &fs[i].kind else {
                continue;
            };
            let key = "filesystem.read_only";
            let real = std::fs::canonicalize(&fs[i].path)
                .map_err(|e| self.invalid(key, format!("{}: {e}", fs[i].path.display())))?;
            let runtime = std::env::var("XDG_RUNTIME_DIR").ok();
            if let Some(why) = super::toolchains::never_shown(&real, runtime.as_deref()) {
                return Err(self.invalid(
                    key,
                    format!(
                        "{} is a symlink to {}, which is never shown inside: {why}; give another path",
                        fs[i].path.display(),
                        real.display()
                    ),
                ));
            }
            if fs[i].path.starts_with(workspace) {
                return Err(self.invalid(
                    key,
                    format!(
                        "{} is a symlink in the workspace: the agent chooses where it points",
                        fs[i].path.display()
                    ),
                ));
            }
            let shown = fs.iter().chain(added.iter()).any(|e: &FsEntry| {
                matches!(e.kind, MountKind::ReadOnly | MountKind::ReadWrite)
                    && real.starts_with(&e.path)
            });
            if !shown {
                added.push(FsEntry {
                    path: real.clone(),
                    kind: MountKind::ReadOnly,
                });
            }
            fs[i].kind = MountKind::Symlink(real.clone());
            links.push((fs[i].path.clone(), real));
        }
        fs.extend(added);
        Ok(links)
    }

    /// One entry: substituted, absolute, no `..`, not `/`, listed once; a
    /// missing optional (`?`) one is dropped.
    fn fs_entry(
        &self,
        ctx: &Context,
        key: &str,
        raw: &str,
        kind: MountKind,
        seen: &mut BTreeSet<PathBuf>,
    ) -> Result<Option<FsEntry>, ProfileError> {
        let (optional, s) = match raw.strip_prefix('?') {
            Some(rest) => (true, rest),
            None => (false, raw),
        };
        let path = PathBuf::from(subst(ctx, s));
        if !path.is_absolute() {
            return Err(self.invalid(key, format!("path {s:?} is not absolute")));
        }
        if path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(self.invalid(key, format!("path {s:?} contains '..'")));
        }
        if path == Path::new("/") {
            return Err(self.invalid(key, "the root itself cannot be listed; the sandbox root is always a fresh read-only tmpfs".into()));
        }
        if !seen.insert(path.clone()) {
            return Err(self.invalid(key, format!("path {} is listed twice", path.display())));
        }
        // A masked path is hidden where it really lives: /lib/x on a
        // merged-/usr host is /usr/lib/x inside the view.
        let path = match (&kind, std::fs::canonicalize(&path)) {
            (MountKind::Masked, Ok(real)) => real,
            _ => path,
        };
        if kind == MountKind::Tmpfs {
            return Ok(Some(FsEntry { path, kind }));
        }
        let kind = match std::fs::symlink_metadata(&path) {
            Err(_) if optional => return Ok(None),
            Err(e) => {
                return Err(self.invalid(
                    key,
                    format!(
                        "{} does not exist ({e}); prefix it with '?' to make it optional",
                        path.display()
                    ),
                ))
            }
            Ok(m) if m.file_type().is_symlink() => match (kind, std::fs::canonicalize(&path)) {
                (_, Err(_)) if optional => return Ok(None),
                (MountKind::ReadOnly | MountKind::ReadWrite, Err(e)) => {
                    return Err(self.invalid(
                        key,
                        format!("{} is a symlink whose target cannot be resolved ({e}); give the real path, or prefix it with '?' to make it optional", path.display()),
                    ))
                }
                (MountKind::ReadWrite, Ok(real)) => {
                    return Err(self.invalid(
                        key,
                        format!("{} is a symlink to {}; a read-write entry is never followed: give the real path", path.display(), real.display()),
                    ))
                }
                (MountKind::ReadOnly, Ok(real)) => MountKind::Symlink(real),
                // Masking a symlink: nothing readable behind it in the sandbox view.
                _ => return Ok(None),
            },
            Ok(_) => kind,
        };
        Ok(Some(FsEntry { path, kind }))
    }
}

/// Read-only entries that are symlinks on the host: (path, resolved target).
type Links = Vec<(PathBuf, PathBuf)>;

/// `{workspace}` and `{home}` substituted.
fn subst(ctx: &Context, s: &str) -> String {
    s.replace("{workspace}", &ctx.workspace.to_string_lossy())
        .replace("{home}", SANDBOX_HOME)
}

/// The user's own sandmux config dir, wherever it is (gap 7): when it lies
/// in a read-write tree, it is guarded there like a listed name.
fn with_config_dir(mut names: Vec<PathBuf>, roots: &[PathBuf]) -> Vec<PathBuf> {
    if let Some(sandmux_dir) = config_dir().parent() {
        for r in roots {
            if let Ok(rel) = sandmux_dir.strip_prefix(r) {
                if !rel.as_os_str().is_empty() && !names.iter().any(|n| n == rel) {
                    names.push(rel.to_path_buf());
                }
            }
        }
    }
    names
}

impl Loaded {
    /// A copy-on-write workspace's path goes into overlayfs's mount options,
    /// where `,` `:` and `\` are separators or escapes.
    fn check_layer_path(&self, ws: &Path) -> Result<(), ProfileError> {
        match ws.to_str() {
            Some(s) if !s.contains([',', ':', '\\']) => Ok(()),
            _ => Err(self.invalid(
                "workspace.mode",
                format!(
                    "a copy-on-write workspace's path must be UTF-8 without ',', ':' or '\\' (overlayfs options): {}",
                    ws.display()
                ),
            )),
        }
    }
}

/// The profile's `[mcp]` under `serve --upstream-timeout`'s ceiling.
fn capped(mcp: &super::McpSettings, cap: Option<u64>) -> super::McpSettings {
    let mut m = mcp.clone();
    if let Some(cap) = cap {
        m.wait_max_seconds = m.wait_max_seconds.min(cap);
        m.ask_seconds = m.ask_seconds.min(cap.max(5));
    }
    m
}

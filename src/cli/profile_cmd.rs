//! `sandmux profile list | show | validate`.

use super::fail;
use crate::profile::{self, Context};
use crate::sandbox::{EXIT_INTERNAL, EXIT_USAGE};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(crate) enum ProfileCmd {
    /// List built-in and user profiles.
    List,
    /// Print a profile's TOML (or, with --resolved, the policy for a workspace).
    Show {
        /// Profile name or path.
        name: String,
        /// Show the resolved policy (paths substituted and checked) and the
        /// sandbox compiled from it: every mount, layer and Landlock rule.
        #[arg(long)]
        resolved: bool,
        /// Format of --resolved: json or toml.
        #[arg(long, default_value = "json", value_parser = ["json", "toml"])]
        format: String,
        /// Workspace to resolve against (default: the current directory).
        #[arg(long, short)]
        workspace: Option<PathBuf>,
    },
    /// Validate a profile file; exit status 2 if invalid.
    Validate {
        /// The file.
        file: PathBuf,
    },
}

/// Prints an error (through `term`: it may quote what the agent chose).
pub(crate) fn profile_cmd(cmd: ProfileCmd) -> ExitCode {
    match cmd {
        ProfileCmd::List => {
            for (name, text) in profile::BUILTINS {
                let d = profile::parse(name, text)
                    .map(|p| p.description)
                    .unwrap_or_default();
                println!("{name:<12} builtin  {d}");
            }
            if let Ok(rd) = std::fs::read_dir(profile::config_dir()) {
                for e in rd.flatten() {
                    let p = e.path();
                    if p.extension().and_then(|x| x.to_str()) == Some("toml") {
                        let d = match profile::load_file(&p) {
                            Ok(l) => l.profile.description,
                            Err(e) => format!("INVALID: {e}"),
                        };
                        let stem = p
                            .file_stem()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .into_owned();
                        let note = if profile::BUILTINS.iter().any(|(n, _)| *n == stem) {
                            " (NOT USED: the built-in of this name wins; rename the file)"
                        } else {
                            ""
                        };
                        println!("{stem:<12} user     {d}{note}");
                    }
                }
            }
            ExitCode::SUCCESS
        }
        ProfileCmd::Show {
            name,
            resolved,
            format,
            workspace,
        } => {
            let loaded = match profile::load(&name) {
                Ok(l) => l,
                Err(e) => return fail(EXIT_USAGE, e),
            };
            if !resolved {
                print!("{}", loaded.text);
                return ExitCode::SUCCESS;
            }
            let ws = match profile::check_workspace(&workspace.unwrap_or_else(|| ".".into())) {
                Ok(w) => w,
                Err(e) => return fail(EXIT_USAGE, e),
            };
            let mut policy = match loaded.resolve(&Context::of(ws, crate::guard::planner)) {
                Ok(p) => p,
                Err(e) => return fail(EXIT_USAGE, e),
            };
            if policy.workspace_mode.has_door() {
                // Made when an instance starts: shown with its placeholders.
                policy.layer = Some("{state}/layers/{id}".into());
            }
            match crate::sandbox::view::resolved(&policy, &format) {
                // Paths can be the agent's: escaped for terminals either way.
                Ok(text) if format == "json" => {
                    println!("{}", crate::term::inert_json(text));
                    ExitCode::SUCCESS
                }
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(EXIT_INTERNAL, e),
            }
        }
        ProfileCmd::Validate { file } => match profile::load_file(&file) {
            Ok(l) => {
                println!(
                    "{}: valid (version {}): {}",
                    file.display(),
                    l.profile.version,
                    l.profile.description
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(EXIT_USAGE, e),
        },
    }
}

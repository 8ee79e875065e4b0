//! The `sandmux` binary: everything is in the library's command line.

fn main() -> std::process::ExitCode {
    sandmux::cli::main()
}

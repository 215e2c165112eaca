//! `stockade completions`: shell completion scripts, generated from the
//! same clap definitions as the help.

use std::process::ExitCode;

use clap::Args;
use clap_complete::Shell;

/// Print a shell completion script
///
/// install.sh installs them for bash, zsh and fish. By hand:
///
///   stockade completions bash > ~/.local/share/bash-completion/completions/stockade
///   stockade completions zsh > ~/.local/share/zsh/site-functions/_stockade
///   stockade completions fish > ~/.config/fish/completions/stockade.fish
///
/// For zsh, that directory must be in $fpath before compinit runs.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = super::command();
    clap_complete::generate(args.shell, &mut command, "stockade", &mut std::io::stdout().lock());
    Ok(ExitCode::SUCCESS)
}

//! `stockade config`: the defaults stockade runs with and where they come from.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::Global;
use super::settings::{self, Flags, Settings, Source};

/// Show the config file's path or the settings in effect
///
/// `config.toml` in stockade's config directory ($XDG_CONFIG_HOME/stockade,
/// usually ~/.config/stockade) holds defaults for `run` and `shell`; their
/// flags override it. Keys: policy (a list of names or paths), cpus,
/// memory, disk (sizes such as "4G"), apply (ask, all or none), color
/// (auto, always or never), home_tools (true or false), keep_sessions and
/// keep_days (how many finished sessions, and for how many days, every run
/// and `stockade sessions --prune` keep), package_cache (a size: how much
/// the cache of checked registry downloads may hold; "0" turns it off; see
/// `stockade cache`). An unknown key or a bad value is
/// an error that names the file and line.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the effective settings, each with where it came from
    ///
    /// The output is TOML: lines can be copied into the config file.
    Show,
    /// Print the config file's path (it need not exist)
    Path,
}

pub fn run(args: ConfigArgs, global: Global) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match args.command {
        ConfigCommand::Path => writeln!(out, "{}", settings::config_path()?.display())?,
        ConfigCommand::Show => {
            let settings = Settings::load()?.with_flags(Flags { color: global.color, ..Flags::default() })?;
            // A policy name that `run` would refuse is refused here too.
            settings.resolve_policy(&[])?;
            out.write_all(show(&settings).as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The settings as TOML, with where each came from as a comment.
fn show(settings: &Settings) -> String {
    let state = if settings.exists { "" } else { " (does not exist)" };
    let mut text = format!("# {}{state}\n", settings.path.display());
    let entries = settings.entries();
    let lines: Vec<String> = entries.iter().map(|(key, value, _)| format!("{key} = {value}")).collect();
    let width = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    for (line, (key, _, source)) in lines.iter().zip(&entries) {
        let mut origin = source.to_string();
        if *key == "policy" && *source == Source::Default {
            origin.push_str(": the default preset, nothing allowed");
        }
        text.push_str(&format!("{line:<width$}  # {origin}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::util::color::ColorChoice;

    #[test]
    fn shows_each_setting_with_its_origin() {
        let file = Settings::parse("cpus = 4\ndisk = \"16G\"\n", PathBuf::from("/c/config.toml")).unwrap();
        let settings = file.with_flags(Flags { color: Some(ColorChoice::Never), ..Flags::default() }).unwrap();
        assert_eq!(
            show(&settings),
            "# /c/config.toml\n\
             policy = []           # default: the default preset, nothing allowed\n\
             cpus = 4              # config file, line 1\n\
             memory = \"2G\"         # default\n\
             disk = \"16G\"          # config file, line 2\n\
             apply = \"ask\"         # default\n\
             color = \"never\"       # --color\n\
             home_tools = true     # default\n\
             keep_sessions = 100   # default\n\
             keep_days = 14        # default\n\
             runs_code = []        # default\n\
             package_cache = \"5G\"  # default\n\
             agent_state = \"4G\"    # default\n"
        );
        let missing = Settings::defaults(PathBuf::from("/c/config.toml"));
        assert!(show(&missing).starts_with("# /c/config.toml (does not exist)\n"), "{}", show(&missing));
    }
}

//! Command-line definitions (clap) and dispatch. One file per subcommand; the
//! doc comments on the fields are the help text.
#![forbid(unsafe_code)]

mod apply;
mod cache;
mod ci;
mod completions;
mod config;
mod diff;
mod discard;
mod doctor;
mod first_run;
mod image;
mod log;
mod man;
mod policy;
mod recover;
mod run;
mod sessions;
mod settings;
mod shell;
mod vmm;

#[cfg(test)]
mod attack_tests;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::protocol::exit::EXIT_STOCKADE;
use crate::util::color::ColorChoice;

/// Run a command inside a local KVM microVM that sees the current workspace,
/// reaches the network only through a policy proxy, and hands its file changes
/// back for review.
#[derive(Debug, Parser)]
#[command(name = "stockade", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// More log output on stderr (repeat for more); RUST_LOG overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    /// When to colour output; overrides `color` in the config file.
    #[arg(long, global = true, value_enum, value_name = "WHEN")]
    color: Option<ColorChoice>,

    #[command(subcommand)]
    command: Command,
}

/// The options every subcommand sees.
#[derive(Debug, Clone, Copy)]
pub struct Global {
    pub verbose: u8,
    /// `--color`, when given.
    pub color: Option<ColorChoice>,
}

/// Each subcommand's arguments are built only when it runs (or help, the
/// manual or completions need them all): clap builds eagerly otherwise, which
/// costs every run, the VMM's too, a noticeable share of its start.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Command {
    Run(run::RunArgs),
    Shell(shell::ShellArgs),
    Doctor(doctor::DoctorArgs),
    Diff(diff::DiffArgs),
    Apply(apply::ApplyArgs),
    Discard(discard::DiscardArgs),
    Recover(recover::RecoverArgs),
    Sessions(sessions::SessionsArgs),
    Policy(policy::PolicyArgs),
    Log(log::LogArgs),
    Config(config::ConfigArgs),
    Image(image::ImageArgs),
    Cache(cache::CacheArgs),
    Completions(completions::CompletionsArgs),
    /// Internal: write the manual pages (regenerates man/).
    #[command(hide = true)]
    Man(man::ManArgs),
    /// Internal: the VMM process of one session, started by `stockade run`.
    #[command(hide = true)]
    Vmm(vmm::VmmArgs),
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse().or_else(|_| parse_whole()) {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help/version to stdout with success, usage errors to stderr.
            let _ = err.print();
            return if err.use_stderr() { ExitCode::from(EXIT_STOCKADE) } else { ExitCode::SUCCESS };
        }
    };
    init_logging(cli.verbose, matches!(cli.command, Command::Vmm(_)));
    let global = Global { verbose: cli.verbose, color: cli.color };
    let result = match cli.command {
        Command::Run(args) => run::run(args, global),
        Command::Shell(args) => shell::run(args, global),
        Command::Doctor(args) => doctor::run(args),
        Command::Diff(args) => diff::run(args, global),
        Command::Apply(args) => apply::run(args, global),
        Command::Discard(args) => discard::run(args, global),
        Command::Recover(args) => recover::run(args, global),
        Command::Sessions(args) => sessions::run(args, global),
        Command::Policy(args) => policy::run(args),
        Command::Log(args) => log::run(args),
        Command::Config(args) => config::run(args, global),
        Command::Image(args) => image::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
        Command::Vmm(args) => vmm::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("stockade: error: {err:#}");
            ExitCode::from(EXIT_STOCKADE)
        }
    }
}

/// The whole command-line definition (completions and manual pages are
/// generated from it; the generators build every subcommand).
pub fn command() -> clap::Command {
    Cli::command()
}

/// Parses the command line with every subcommand built, as help and usage
/// errors must show them all.
fn parse_whole() -> Result<Cli, clap::Error> {
    let mut whole = Cli::command();
    whole.build();
    whole.try_get_matches().and_then(|matches| Cli::from_arg_matches(&matches))
}

/// Logging on stderr. The VMM's stderr is the session's vmm.log, and a
/// guest can provoke its warnings, so there it is capped. At default
/// verbosity messages are plain (`stockade: warning: ...`), like every other
/// line stockade prints; timestamps, levels and targets come with `-v` or
/// RUST_LOG, and always in vmm.log, where they date the guest's events.
fn init_logging(verbose: u8, vmm: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "stockade=info",
        2 => "stockade=debug",
        _ => "stockade=trace",
    };
    let from_env = EnvFilter::try_from_default_env().ok();
    let plain = verbose == 0 && from_env.is_none() && !vmm;
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if vmm {
        use crate::logcap::{Capped, Style, VMM_LOG_CAP};
        let capped = Capped::new(std::io::stderr(), "vmm.log", Style::Text, VMM_LOG_CAP);
        builder.with_writer(std::sync::Mutex::new(capped)).try_init()
    } else if plain {
        builder.event_format(Plain).with_writer(std::io::stderr).try_init()
    } else {
        builder.with_writer(std::io::stderr).try_init()
    };
}

/// The default-verbosity event format: `stockade: warning: MESSAGE`, no
/// timestamp, level column, colour or target.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::FormatFields as _;
        let kind = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            _ => "",
        };
        write!(writer, "stockade: {kind}")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

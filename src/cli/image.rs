//! `stockade image`: root filesystem images for `run --image`.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::image::{self, Recipe};
use crate::paths::Dirs;
use crate::progress::Steps;

/// Build, list and remove root filesystem images for `run --image`
///
/// An image is a Debian tree built by mmdebstrap from a recipe: one shipped
/// with stockade (debian: git, curl, CA certificates; dev: build-essential,
/// Python, Node.js) or a TOML file of yours with `description`, `suite`,
/// `packages` and `[files]`. Images are cached by the hash of their recipe:
/// building again is free until the recipe changes.
#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build an image from a recipe (a shipped name or a path to a .toml file)
    Build {
        #[arg(value_name = "NAME|RECIPE")]
        name: String,
    },
    /// List the built images and the shipped recipes
    List,
    /// Remove every built image of NAME
    Rm {
        #[arg(value_name = "NAME")]
        name: String,
    },
}

pub fn run(args: ImageArgs) -> anyhow::Result<ExitCode> {
    let dirs = Dirs::resolve()?;
    let mut out = std::io::stdout().lock();
    match args.command {
        ImageCommand::Build { name } => {
            eprintln!("stockade: building image {name} (a few minutes the first time)");
            let mut steps = Steps::stderr(format!("image {name}"));
            let outcome = image::build(&dirs.cache, &name, |step| steps.step(step));
            steps.finish();
            let outcome = outcome?;
            let (built, verb) = match outcome {
                image::BuildOutcome::Cached(b) => (b, "already built"),
                image::BuildOutcome::Built(b) => (b, "built"),
            };
            writeln!(out, "{} {verb}: {} ({})", built.name, built.path.display(), human(built.bytes))?;
        }
        ImageCommand::List => {
            let built = image::list(&dirs.cache)?;
            for (name, _) in image::BUILT_IN {
                let recipe = Recipe::load(name)?;
                let state = match built.iter().find(|b| b.name == *name && b.key == recipe.key()) {
                    Some(b) => format!("built, {}", human(b.bytes)),
                    None => "not built".to_string(),
                };
                writeln!(out, "{name:10} {state:18} {}", recipe.description)?;
            }
            for other in built.iter().filter(|b| Recipe::load(&b.name).map(|r| r.key() != b.key).unwrap_or(true)) {
                writeln!(
                    out,
                    "{:10} {:18} {}",
                    other.name,
                    format!("built, {}", human(other.bytes)),
                    other.path.display()
                )?;
            }
        }
        ImageCommand::Rm { name } => match image::remove(&dirs.cache, &name)? {
            0 => anyhow::bail!("no image named {name:?} is built; `stockade image list` shows them"),
            n => writeln!(out, "removed {n} image{} of {name}", if n == 1 { "" } else { "s" })?,
        },
    }
    Ok(ExitCode::SUCCESS)
}

fn human(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}

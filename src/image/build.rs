//! Building an image: mmdebstrap makes the Debian tree without root (its
//! unshare mode where user namespaces work, fakechroot otherwise, plain
//! root when run as root) and writes it as an ext2 image, which the guest
//! mounts read-only under a writable overlay.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use super::recipe::Recipe;
use super::{Built, ImageError, image_path, store_dir};

/// What a build did.
#[derive(Debug)]
pub enum Outcome {
    /// The recipe's image was already in the store.
    Cached(Built),
    Built(Built),
}

/// Builds `name` (a built-in recipe or a recipe file) unless the store has
/// it; `say` gets one line per step of the build.
pub fn build(cache: &Path, name: &str, mut say: impl FnMut(&str)) -> Result<Outcome, ImageError> {
    let recipe = Recipe::load(name)?;
    let key = recipe.key();
    let path = image_path(cache, &recipe.name, &key);
    if let Ok(meta) = std::fs::metadata(&path) {
        return Ok(Outcome::Cached(Built { name: recipe.name, key, path, bytes: meta.len() }));
    }
    if which("mmdebstrap").is_none() {
        return Err(ImageError::NoBuilder);
    }
    let store = store_dir(cache);
    std::fs::create_dir_all(&store)
        .map_err(|source| ImageError::Store { path: store.display().to_string(), source })?;
    let fail = |message: String| ImageError::Build { name: recipe.name.clone(), message };
    let staging = tempdir(&store).map_err(|e| fail(format!("cannot make a work directory: {e}")))?;
    let partial = staging.join("image.img");

    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--variant={}", recipe.variant))
        .arg("--mode=auto")
        .arg("--format=ext2")
        .arg("--verbose")
        // On failure mmdebstrap signals its whole process group; keep that
        // from reaching stockade's caller (a shell, a test runner).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if !recipe.packages.is_empty() {
        cmd.arg(format!("--include={}", recipe.packages.join(",")));
    }
    for (index, (target, content)) in recipe.files.iter().enumerate() {
        let local = staging.join(format!("file-{index}"));
        std::fs::write(&local, content).map_err(|e| fail(format!("cannot stage {target}: {e}")))?;
        if let Some(parent) = Path::new(target).parent() {
            cmd.arg(format!("--customize-hook=mkdir -p \"$1{}\"", parent.display()));
        }
        cmd.arg(format!("--customize-hook=upload {} {target}", local.display()));
    }
    cmd.arg(&recipe.suite).arg(&partial);
    let mut child = cmd.spawn().map_err(|e| fail(format!("cannot start mmdebstrap: {e}")))?;
    let mut errors = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(step) = line.strip_prefix("I: ") {
                say(step);
            } else if line.starts_with("E: ") || line.contains("Unable to locate package") {
                errors.push(line);
            }
        }
    }
    let status = child.wait().map_err(|e| fail(format!("mmdebstrap: {e}")))?;
    let result = if status.success() {
        std::fs::rename(&partial, &path).map_err(|e| fail(format!("cannot store the image: {e}")))
    } else {
        Err(fail(explain(&recipe, &errors, status.code())))
    };
    let _ = std::fs::remove_dir_all(&staging);
    result?;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    Ok(Outcome::Built(Built { name: recipe.name, key, path, bytes }))
}

/// The reason a build failed, naming the package or the recipe line.
fn explain(recipe: &Recipe, errors: &[String], code: Option<i32>) -> String {
    for line in errors {
        if let Some(package) = line.split("Unable to locate package ").nth(1) {
            return format!("apt cannot find the package {:?} named in {}", package.trim(), recipe.origin);
        }
    }
    match errors.first() {
        Some(line) => format!("{} (recipe {})", line.trim_start_matches("E: "), recipe.origin),
        None => {
            format!("mmdebstrap exited with {code:?}; run it with --verbose for details (recipe {})", recipe.origin)
        }
    }
}

fn tempdir(parent: &Path) -> std::io::Result<std::path::PathBuf> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = parent.join(format!(".build-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_package_is_named_with_the_recipe() {
        let recipe =
            Recipe::parse("t", "t.toml", "description = \"x\"\nsuite = \"bookworm\"\npackages = [\"nosuch\"]").unwrap();
        let errors = vec!["E: Unable to locate package nosuch".to_string()];
        let text = explain(&recipe, &errors, Some(1));
        assert!(text.contains("\"nosuch\"") && text.contains("t.toml"), "{text}");
    }
}

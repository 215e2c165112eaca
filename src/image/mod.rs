//! Image mode's root filesystems: Debian trees built by mmdebstrap from a
//! recipe (rootfs/images/NAME.toml, or a recipe file of the user's), kept as
//! read-only disk images in the cache under the hash of their recipe, so a
//! run is reproducible and a second build of the same recipe is free.

#![forbid(unsafe_code)]

mod build;
mod recipe;

use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use build::{Outcome as BuildOutcome, build};
pub use recipe::{BUILT_IN, Recipe};

#[derive(Debug, Error)]
pub enum ImageError {
    #[error(
        "there is no image recipe named {name:?}: use one of {}, or a path to a .toml recipe",
        BUILT_IN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    )]
    UnknownRecipe { name: String },
    #[error("cannot read the recipe {path}")]
    ReadRecipe {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the recipe {origin} is not valid: {message}")]
    BadRecipe { origin: String, message: String },
    #[error("the image {name:?} is not built (or its recipe changed): run `stockade image build {name}` first")]
    NotBuilt { name: String },
    #[error("mmdebstrap is not installed: run `sudo apt-get install mmdebstrap genext2fs` (or ./install.sh)")]
    NoBuilder,
    #[error("building the image {name:?} failed: {message}")]
    Build { name: String, message: String },
    #[error("cannot use the image store {path}")]
    Store {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One built image in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub name: String,
    pub key: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// Where images live: `<cache>/images/<name>-<key>.img`.
pub fn store_dir(cache: &Path) -> PathBuf {
    cache.join("images")
}

fn image_path(cache: &Path, name: &str, key: &str) -> PathBuf {
    store_dir(cache).join(format!("{name}-{key}.img"))
}

/// The built image of `name` for its current recipe.
pub fn find(cache: &Path, name: &str) -> Result<Built, ImageError> {
    let recipe = Recipe::load(name)?;
    let path = image_path(cache, &recipe.name, &recipe.key());
    match fs::metadata(&path) {
        Ok(meta) => Ok(Built { name: recipe.name.clone(), key: recipe.key(), path, bytes: meta.len() }),
        Err(_) => Err(ImageError::NotBuilt { name: name.to_string() }),
    }
}

/// Every image in the store, by name.
pub fn list(cache: &Path) -> Result<Vec<Built>, ImageError> {
    let dir = store_dir(cache);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ImageError::Store { path: dir.display().to_string(), source }),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some((name, key)) = file.to_str().and_then(|f| f.strip_suffix(".img")).and_then(|f| f.rsplit_once('-'))
        else {
            continue;
        };
        let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
        found.push(Built { name: name.to_string(), key: key.to_string(), path: entry.path(), bytes });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name).then(a.key.cmp(&b.key)));
    Ok(found)
}

/// Removes every image of `name`; returns how many there were.
pub fn remove(cache: &Path, name: &str) -> Result<usize, ImageError> {
    let mut removed = 0;
    for image in list(cache)?.into_iter().filter(|i| i.name == name) {
        fs::remove_file(&image.path)
            .map_err(|source| ImageError::Store { path: image.path.display().to_string(), source })?;
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_lists_and_removes_by_name() {
        let cache = std::env::temp_dir().join(format!("stockade-images-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        assert!(list(&cache).unwrap().is_empty(), "no store yet is an empty store");
        fs::create_dir_all(store_dir(&cache)).unwrap();
        for f in ["debian-00aa.img", "debian-11bb.img", "dev-22cc.img", "stray.txt", "debian-33dd.img.tmp"] {
            fs::write(store_dir(&cache).join(f), "x").unwrap();
        }
        let names: Vec<String> = list(&cache).unwrap().iter().map(|i| format!("{}-{}", i.name, i.key)).collect();
        assert_eq!(names, ["debian-00aa", "debian-11bb", "dev-22cc"]);
        assert_eq!(remove(&cache, "debian").unwrap(), 2);
        assert_eq!(list(&cache).unwrap().len(), 1);
        assert!(matches!(find(&cache, "debian"), Err(ImageError::NotBuilt { .. })));
        fs::remove_dir_all(&cache).unwrap();
    }
}

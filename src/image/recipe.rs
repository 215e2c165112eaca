//! Image recipes: what Debian suite, which packages, which extra files.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::ImageError;

/// The recipes that ship with stockade, by name.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("debian", include_str!("../../rootfs/images/debian.toml")),
    ("dev", include_str!("../../rootfs/images/dev.toml")),
    ("docker", include_str!("../../rootfs/images/docker.toml")),
];

/// Bump when the way images are built changes, so old builds are not reused.
const BUILDER_VERSION: &str = "1";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    description: String,
    suite: String,
    #[serde(default = "default_variant")]
    variant: String,
    #[serde(default)]
    packages: Vec<String>,
    /// Extra files: absolute path in the image = content.
    #[serde(default)]
    files: BTreeMap<String, String>,
}

fn default_variant() -> String {
    "apt".into()
}

/// A recipe with its name and where it came from.
#[derive(Debug, Clone)]
pub struct Recipe {
    pub name: String,
    pub origin: String,
    pub description: String,
    pub suite: String,
    pub variant: String,
    pub packages: Vec<String>,
    pub files: BTreeMap<String, String>,
    text: String,
}

impl Recipe {
    /// A built-in recipe by name, or a recipe file (a path ending in .toml:
    /// the image is named after the file).
    pub fn load(name_or_path: &str) -> Result<Recipe, ImageError> {
        if name_or_path.ends_with(".toml") {
            let path = Path::new(name_or_path);
            let text = std::fs::read_to_string(path)
                .map_err(|source| ImageError::ReadRecipe { path: path.display().to_string(), source })?;
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("image").to_string();
            return Recipe::parse(&name, &path.display().to_string(), &text);
        }
        let Some((name, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) else {
            return Err(ImageError::UnknownRecipe { name: name_or_path.to_string() });
        };
        Recipe::parse(name, &format!("rootfs/images/{name}.toml"), text)
    }

    pub fn parse(name: &str, origin: &str, text: &str) -> Result<Recipe, ImageError> {
        let bad = |message: String| ImageError::BadRecipe { origin: origin.to_string(), message };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            return Err(bad(format!("{name:?} is not a usable image name: use letters, digits, '_' and '.'")));
        }
        let file: RecipeFile = toml::from_str(text).map_err(|e| bad(e.to_string().trim().to_string()))?;
        if !file.suite.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') || file.suite.is_empty() {
            return Err(bad(format!("suite {:?} is not a Debian suite name (e.g. bookworm)", file.suite)));
        }
        let variants = ["essential", "apt", "required", "minbase", "buildd", "important", "standard"];
        if !variants.contains(&file.variant.as_str()) {
            return Err(bad(format!("variant {:?} is not one of {}", file.variant, variants.join(", "))));
        }
        for package in &file.packages {
            let valid = package.len() >= 2
                && package.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
                && package.starts_with(|c: char| c.is_ascii_alphanumeric());
            if !valid {
                return Err(bad(format!("{package:?} is not a Debian package name")));
            }
        }
        for path in file.files.keys() {
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") || path.ends_with('/') {
                return Err(bad(format!("file path {path:?} must be absolute, without '..'")));
            }
        }
        Ok(Recipe {
            name: name.to_string(),
            origin: origin.to_string(),
            description: file.description,
            suite: file.suite,
            variant: file.variant,
            packages: file.packages,
            files: file.files,
            text: text.to_string(),
        })
    }

    /// The cache key: the recipe's text and the builder's version.
    pub fn key(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(BUILDER_VERSION.as_bytes());
        hash.update([0]);
        hash.update(self.text.as_bytes());
        hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_recipes_parse() {
        for (name, _) in BUILT_IN {
            let recipe = Recipe::load(name).unwrap();
            assert_eq!(recipe.suite, "bookworm");
            assert!(recipe.packages.contains(&"git".to_string()), "{name}");
            assert_eq!(recipe.key().len(), 16);
        }
        assert_ne!(Recipe::load("debian").unwrap().key(), Recipe::load("dev").unwrap().key());
    }

    #[test]
    fn bad_recipes_say_what_is_wrong() {
        let err = |text: &str| Recipe::parse("t", "t.toml", text).unwrap_err().to_string();
        assert!(err("description = \"x\"\nsuite = \"bookworm\"\npackages = [\"Bad Name\"]").contains("\"Bad Name\""));
        assert!(err("description = \"x\"\nsuite = \"bookworm\"\nextra = 1").contains("extra"));
        assert!(err("description = \"x\"\nsuite = \"book worm\"").contains("suite"));
        assert!(err("description = \"x\"\nsuite = \"bookworm\"\n[files]\n\"../x\" = \"\"").contains("absolute"));
        let line = err("description = \"x\"\nsuite = \"bookworm\"\npackages = [\n\"git\",\n3]");
        assert!(line.contains("line 5") || line.contains("5:"), "{line}");
        assert!(matches!(Recipe::load("nope"), Err(ImageError::UnknownRecipe { .. })));
    }
}

//! The policies shipped in the binary (`policies/*.toml`). A user policy of
//! the same name in `~/.config/stockade/policies/` takes precedence.

/// Preset names, in the order `stockade policy list` shows them.
pub const NAMES: &[&str] = &["default", "npm", "cargo", "pypi", "github", "docker", "claude", "codex", "gemini"];

/// The text of a preset.
pub fn get(name: &str) -> Option<&'static str> {
    Some(match name {
        "default" => include_str!("../../policies/default.toml"),
        "npm" => include_str!("../../policies/npm.toml"),
        "cargo" => include_str!("../../policies/cargo.toml"),
        "pypi" => include_str!("../../policies/pypi.toml"),
        "github" => include_str!("../../policies/github.toml"),
        "docker" => include_str!("../../policies/docker.toml"),
        "claude" => include_str!("../../policies/claude.toml"),
        "codex" => include_str!("../../policies/codex.toml"),
        "gemini" => include_str!("../../policies/gemini.toml"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Host, Port, Verdict, parse};

    #[test]
    fn every_preset_parses_and_has_a_description() {
        for name in NAMES {
            let text = get(name).unwrap_or_else(|| panic!("preset {name} is listed but missing"));
            let policy = parse(text, name).unwrap_or_else(|e| panic!("preset {name}: {e}"));
            assert!(policy.description.is_some(), "preset {name} has no description");
        }
    }

    #[test]
    fn every_file_in_policies_is_a_listed_preset() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let stem = name.strip_suffix(".toml").unwrap_or(&name);
            assert!(NAMES.contains(&stem), "policies/{name} is not embedded");
        }
    }

    #[test]
    fn presets_allow_the_hosts_their_tools_need() {
        let allowed = |preset: &str, host: &str| {
            let policy = parse(get(preset).unwrap(), preset).unwrap();
            matches!(policy.verdict(&Host::parse(host).unwrap(), Port::HTTPS), Verdict::Allow { .. })
        };
        assert!(allowed("cargo", "index.crates.io") && allowed("cargo", "static.crates.io"));
        assert!(allowed("npm", "registry.npmjs.org"));
        assert!(allowed("pypi", "files.pythonhosted.org"));
        assert!(allowed("github", "codeload.github.com") && !allowed("github", "gist.github.com"));
        assert!(allowed("claude", "api.anthropic.com") && !allowed("claude", "statsig.anthropic.com"));
        assert!(allowed("codex", "chatgpt.com"));
        assert!(!allowed("default", "registry.npmjs.org"));
    }
}

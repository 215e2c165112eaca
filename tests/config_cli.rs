//! `config.toml` as a user meets it: where it is, what `config show` says,
//! its mistakes, and the flags over it. No VM is started.

use std::path::Path;

use crate::util::{TempDir, stockade_in, text};

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("xdg/stockade/config.toml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_config_file_lives_in_xdg_config_home() {
    let dir = TempDir::new("config-path");
    let out = stockade_in(dir.path(), &["config", "path"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{}\n", dir.path().join("xdg/stockade/config.toml").display()));
}

#[test]
fn show_names_where_each_setting_came_from() {
    let dir = TempDir::new("config-show");
    let path = write_config(dir.path(), "# defaults\ncpus = 4\ncolor = \"never\"\n");
    let out = stockade_in(dir.path(), &["--color", "always", "config", "show"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.starts_with(&format!("# {}\n", path.display())), "{shown}");
    assert!(shown.contains("cpus = 4 ") && shown.contains("# config file, line 2"), "{shown}");
    assert!(shown.contains("memory = \"2G\"") && shown.contains("# default"), "{shown}");
    assert!(shown.contains("color = \"always\"") && shown.contains("# --color"), "{shown}");
}

#[test]
fn a_bad_key_or_value_names_the_file_line_and_fix() {
    let dir = TempDir::new("config-bad");
    let path = write_config(dir.path(), "cpus = 4\nmemroy = \"4G\"\n");
    let out = stockade_in(dir.path(), &["config", "show"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{}:2:1: unknown setting `memroy`", path.display())), "{err}");
    assert!(err.contains("remove it or correct its name"), "{err}");

    write_config(dir.path(), "disk = \"1M\"\n");
    let out = stockade_in(dir.path(), &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains(":1:8: disk = \"1M\" is too small: give at least 64M (e.g. disk = \"1G\")"), "{err}");

    write_config(dir.path(), "policy = [\"nmp\"]\n");
    let out = stockade_in(dir.path(), &["config", "show"]);
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{}:1: policy: no policy named \"nmp\"", path.display())), "{err}");
}

#[test]
fn flags_override_the_config_file() {
    let dir = TempDir::new("config-flags");
    write_config(dir.path(), "cpus = 4\npolicy = [\"nmp\"]\n");
    // The flag's value is the one checked, so the flag's name is in the error.
    let out = stockade_in(dir.path(), &["run", "--cpus", "0", "--policy", "npm", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("--cpus 0 is out of range"), "{}", text(&out.stderr));
    // --policy replaces the file's list: its unknown name no longer matters.
    // (The missing kernel stops the run before any VM starts.)
    let out = stockade_in(dir.path(), &["run", "--policy", "npm", "--kernel", "/nonexistent/vmlinux", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(!text(&out.stderr).contains("nmp"), "{}", text(&out.stderr));
}

//! The command line itself: help, version, bad input.

use crate::util::{TempDir, stockade, text};

#[test]
fn help_lists_working_subcommands() {
    let dir = TempDir::new("help");
    let out = stockade(dir.path(), &["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(help.contains("doctor"), "{help}");
}

#[test]
fn version_prints_the_package_version() {
    let dir = TempDir::new("version");
    let out = stockade(dir.path(), &["--version"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout).trim(), format!("stockade {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn unknown_flag_exits_125_with_a_hint() {
    let dir = TempDir::new("badflag");
    let out = stockade(dir.path(), &["doctor", "--frobnicate"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("--frobnicate"), "{err}");
    assert!(err.contains("--help"), "{err}");
}

#[test]
fn unknown_subcommand_exits_125() {
    let dir = TempDir::new("badcmd");
    let out = stockade(dir.path(), &["frobnicate"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("frobnicate"));
}

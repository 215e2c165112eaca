//! `--help` of every subcommand against the snapshots in
//! tests/snapshots/help/, so that a change to the command line shows up in
//! review as a change to these files.

use std::collections::BTreeSet;
use std::process::Command;

use crate::util::{TempDir, crate_root, line_diff, stockade_bin, text, updating_snapshots};

const REGENERATE: &str = "UPDATE_SNAPSHOTS=1 cargo test --release --test integration help::";

/// Help as a user sees it in an 100-column terminal, without colour.
fn help(path: &[String], home: &TempDir) -> String {
    let out = Command::new(stockade_bin())
        .args(path)
        .arg("--help")
        .env("COLUMNS", "100")
        .env("STOCKADE_CONFIG_DIR", home.path())
        .env_remove("CLICOLOR_FORCE")
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade");
    assert!(out.status.success(), "stockade {} --help failed: {}", path.join(" "), text(&out.stderr));
    text(&out.stdout)
}

/// The subcommands a help text lists (the `help` pseudo-command left out).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn help_of_every_subcommand_matches_its_snapshot() {
    let home = TempDir::new("help-snapshots");
    let dir = crate_root().join("tests/snapshots/help");
    if updating_snapshots() {
        std::fs::create_dir_all(&dir).expect("create the snapshot directory");
    }
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = BTreeSet::new();
    let mut failures = Vec::new();
    while let Some(path) = todo.pop() {
        let actual = help(&path, &home);
        for sub in subcommands(&actual) {
            let mut child = path.clone();
            child.push(sub);
            todo.push(child);
        }
        let name = std::iter::once("stockade").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join("-");
        let file = dir.join(format!("{name}.txt"));
        seen.insert(format!("{name}.txt"));
        if updating_snapshots() {
            std::fs::write(&file, &actual).expect("write a snapshot");
            continue;
        }
        match std::fs::read_to_string(&file) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!("{}:\n{}", file.display(), line_diff(&expected, &actual))),
            Err(_) => failures.push(format!("{} is missing", file.display())),
        }
    }
    let stale: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    for name in stale.into_iter().filter(|n| !seen.contains(n)) {
        if updating_snapshots() {
            std::fs::remove_file(dir.join(&name)).expect("remove a stale snapshot");
        } else {
            failures.push(format!("{} belongs to no subcommand", dir.join(name).display()));
        }
    }
    assert!(
        failures.is_empty(),
        "the help differs from its snapshots; if the change is intended, run\n  {REGENERATE}\n\n{}",
        failures.join("\n")
    );
}

#[test]
fn lists_the_subcommands_of_a_help_text() {
    let help = "Usage: x\n\nCommands:\n  list  List things\n  show  Show one\n  help  Print help\n\nOptions:\n";
    assert_eq!(subcommands(help), ["list", "show"]);
}

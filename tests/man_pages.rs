//! The manual pages checked in under man/ are what the command line
//! generates now.

use std::collections::BTreeMap;
use std::path::Path;

use crate::util::{TempDir, crate_root, line_diff, stockade_bin, text, updating_snapshots};

const REGENERATE: &str = "cargo run --release -- man --out-dir man";

fn pages(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| name.ends_with(".1"))
                .map(|name| (name.clone(), std::fs::read_to_string(dir.join(&name)).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn checked_in_man_pages_are_current() {
    let tmp = TempDir::new("man");
    let out = std::process::Command::new(stockade_bin())
        .args(["man", "--out-dir"])
        .arg(tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade");
    assert!(out.status.success(), "stockade man failed: {}", text(&out.stderr));
    let generated = pages(tmp.path());
    assert!(generated.contains_key("stockade.1") && generated.contains_key("stockade-run.1"), "{generated:?}");

    let dir = crate_root().join("man");
    if updating_snapshots() {
        std::fs::create_dir_all(&dir).expect("create man/");
        for name in pages(&dir).keys().filter(|name| !generated.contains_key(*name)) {
            std::fs::remove_file(dir.join(name)).expect("remove a stale page");
        }
        for (name, page) in &generated {
            std::fs::write(dir.join(name), page).expect("write a page");
        }
        return;
    }
    let checked_in = pages(&dir);
    let mut problems = Vec::new();
    for (name, page) in &generated {
        match checked_in.get(name) {
            Some(old) if old == page => {}
            Some(old) => problems.push(format!("man/{name} is stale:\n{}", line_diff(old, page))),
            None => problems.push(format!("man/{name} is missing")),
        }
    }
    for name in checked_in.keys().filter(|name| !generated.contains_key(*name)) {
        problems.push(format!("man/{name} belongs to no subcommand: remove it"));
    }
    assert!(
        problems.is_empty(),
        "the manual pages are out of date; regenerate them with\n  {REGENERATE}\n\n{}",
        problems.join("\n")
    );
}

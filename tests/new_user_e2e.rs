//! A new user's first minutes: the README's quick-start `stockade run`
//! example, taken from the README as written and run as a user would, then
//! the review commands it points to.

use crate::rig;
use crate::run_e2e::{T, script};
use crate::util::{crate_root, stockade_bin};

/// The `stockade run` line of the README's quick start.
fn quick_start_example() -> String {
    let readme = std::fs::read_to_string(crate_root().join("README.md")).expect("read README.md");
    let section = readme.split("\n## Quick start\n").nth(1).expect("README.md has a Quick start section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .find(|line| line.starts_with("stockade run "))
        .expect("the quick start has a `stockade run` line")
        .to_string()
}

#[test]
fn the_quick_start_example_is_a_stockade_run_line() {
    let example = quick_start_example();
    assert!(example.starts_with("stockade run -- "), "{example}");
}

#[test]
fn the_readme_quick_start_works_as_written() {
    let Some(rig) = rig::require("the_readme_quick_start_works_as_written") else { return };
    let example = quick_start_example();
    let bin_dir =
        std::path::Path::new(stockade_bin()).parent().expect("the binary has a directory").display().to_string();
    let out = rig.sh(
        &script(&format!(
            "export PATH=\"{bin_dir}:$PATH\"
             touch \"$HOME/host-file-quickstart\"
             {example}
             echo \"run=$?\"
             test -e hello.txt && echo hello-leaked || echo hello-staged
             stockade diff --stat; echo \"stat=$?\"
             stockade apply; echo \"apply=$?\"
             echo \"hello=$(cat hello.txt)\""
        )),
        T,
    );
    // uname -r, then the guest's home (at most shared toolchains), then the status.
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("6.12.")), "uname -r must print the guest kernel\n{out}");
    let home: Vec<&str> = lines.iter().skip(1).take_while(|l| !l.starts_with("run=")).copied().collect();
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(
        home.iter().all(|entry| entry.starts_with('.') && !matches!(*entry, ".ssh" | ".aws" | ".config" | ".claude")),
        "ls -A ~ may list only shared toolchain directories, never the home's own files\n{out}"
    );
    assert!(out.stdout.contains("hello-staged"), "nothing may land before apply\n{out}");
    assert!(out.stderr.contains("hello.txt"), "the summary after the run names the new file\n{out}");
    assert!(out.stderr.contains("stockade apply"), "without a terminal it says how to apply\n{out}");
    assert!(out.stdout.contains("stat=0") && out.stdout.contains("apply=0"), "{out}");
    assert!(out.stdout.contains("hello=hello"), "{out}");
    assert!(!out.stderr.contains("first run in"), "the notice is only for a terminal\n{out}");
}

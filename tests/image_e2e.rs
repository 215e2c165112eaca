//! Image mode: `stockade image build` makes a Debian root with mmdebstrap,
//! cached by its recipe; `run --image` boots on it with the host's system
//! out of sight.

use std::path::Path;
use std::process::Command;

use crate::rig;
use crate::run_e2e::{T, script};
use crate::util::{TempDir, stockade_bin};

/// mmdebstrap and genext2fs are installed, or why the test cannot run.
pub(crate) fn builder_available(test: &str) -> bool {
    let missing: Vec<&str> = ["mmdebstrap", "genext2fs"]
        .into_iter()
        .filter(|tool| {
            !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(tool).is_file())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("{} not installed (apt-get install mmdebstrap genext2fs)", missing.join(" and "));
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: required under CI but {why}");
    }
    eprintln!("skipping {test}: {why}");
    false
}

pub(crate) fn image(args: &[&str]) -> std::process::Output {
    Command::new(stockade_bin()).arg("image").args(args).env_remove("RUST_LOG").output().expect("run stockade image")
}

pub(crate) fn text(out: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_built_image_is_a_cache_hit_and_a_broken_recipe_names_the_package() {
    if !builder_available("a_built_image_is_a_cache_hit_and_a_broken_recipe_names_the_package") {
        return;
    }
    let first = image(&["build", "debian"]);
    assert!(first.status.success(), "{}", text(&first));
    let again = image(&["build", "debian"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("debian already built"), "{}", text(&again));
    let list = image(&["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("debian     built"), "{}", text(&list));

    let dir = TempDir::new("broken-recipe");
    let recipe = dir.path().join("broken.toml");
    std::fs::write(
        &recipe,
        "description = \"x\"\nsuite = \"bookworm\"\npackages = [\"git\", \"no-such-package-xyz\"]\n",
    )
    .unwrap();
    let broken = image(&["build", &recipe.display().to_string()]);
    assert_eq!(broken.status.code(), Some(125), "{}", text(&broken));
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(stderr.contains("\"no-such-package-xyz\"") && stderr.contains("broken.toml"), "{}", text(&broken));
    std::fs::write(&recipe, "description = \"x\"\nsuite = \"bookworm\"\npackages = [\n\"git\",\n7]\n").unwrap();
    let malformed = image(&["build", &recipe.display().to_string()]);
    let stderr = String::from_utf8_lossy(&malformed.stderr);
    assert!(stderr.contains("line 5"), "the error must name the line\n{}", text(&malformed));
    assert!(!Path::new(&recipe).with_extension("img").exists());
}

#[test]
fn run_on_the_debian_image_sees_the_image_not_the_host() {
    let Some(rig) = rig::require("run_on_the_debian_image_sees_the_image_not_the_host") else { return };
    if !builder_available("run_on_the_debian_image_sees_the_image_not_the_host") {
        return;
    }
    let built = image(&["build", "debian"]);
    assert!(built.status.success(), "{}", text(&built));
    let out = rig.sh(
        &script(
            r#"echo host-file > seen.txt
             $S run --image debian --apply=all -- sh -c '. /etc/os-release; echo "os=$VERSION_CODENAME"; git --version
                 test -e /usr/bin/qemu-system-x86_64 && echo host-usr-visible || echo host-usr-hidden
                 cat seen.txt; echo from-image > made.txt; hostname
                 env -i sh -c ". /etc/profile.d/stockade.sh; echo profile-proxy=\$HTTPS_PROXY"'
             echo "run=$?"
             cat made.txt
             $S run --image no-such-image -- true; echo "missing=$?""#,
        ),
        T,
    );
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("os=bookworm") && out.stdout.contains("git version"), "{out}");
    assert!(out.stdout.contains("host-usr-hidden"), "the host's /usr must not be visible\n{out}");
    assert!(
        out.stdout.contains("profile-proxy=http://127.0.0.1:3128"),
        "a clean shell gets the proxy from /etc/profile.d\n{out}"
    );
    assert!(out.stdout.contains("host-file\n") && out.stdout.contains("\nfrom-image\n"), "the workspace works\n{out}");
    assert!(
        out.stdout.contains("missing=125") && out.stderr.contains("no image recipe named \"no-such-image\""),
        "{out}"
    );
}

//! `stockade policy` and `stockade log` as a user runs them: no VM needed.

use crate::util::{TempDir, stockade_bin, text};

fn run(dir: &TempDir, args: &[&str]) -> std::process::Output {
    std::process::Command::new(stockade_bin())
        .args(args)
        .env("STOCKADE_DATA_DIR", dir.path().join("data"))
        .env("STOCKADE_CONFIG_DIR", dir.path().join("config"))
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade")
}

#[test]
fn policy_check_names_the_file_and_line_of_a_mistake() {
    let dir = TempDir::new("policy-check");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[network]\nallow = [\"registry.npmjs.org\"]\nalow = [\"x.com\"]\n").unwrap();
    let out = run(&dir, &["policy", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{}:3:1: unknown field `alow`", bad.display())), "{err}");

    std::fs::write(&bad, "[network]\nallow = [\"registry.npmjs.org\"]\n").unwrap();
    let out = run(&dir, &["policy", "check", bad.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok (1 allow"), "{}", text(&out.stdout));
}

#[test]
fn policy_list_shows_presets_and_user_policies() {
    let dir = TempDir::new("policy-list");
    let policies = dir.path().join("config/policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("npm.toml"), "description = \"my mirror\"\n").unwrap();
    let out = run(&dir, &["policy", "list"]);
    assert!(out.status.success());
    let list = text(&out.stdout);
    assert!(list.contains("npm        my mirror"), "{list}");
    assert!(list.contains("(yours is used instead)") && list.contains("claude"), "{list}");
}

#[test]
fn policy_show_merges_with_deny_winning() {
    let dir = TempDir::new("policy-show");
    let out = run(&dir, &["policy", "show", "github", "--allow", "gist.github.com"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("gist.github.com (--allow)") && shown.contains("gist.github.com:* (preset github)"),
        "{shown}"
    );
}

#[test]
fn policy_show_and_check_name_credential_scopes_and_path_denials() {
    let dir = TempDir::new("policy-scope");
    let out = run(&dir, &["policy", "show", "github"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("Deny requests under a path"), "{shown}");
    assert!(shown.contains("  api.github.com/user/keys (preset github)\n"), "{shown}");
    assert!(shown.contains("  api.github.com/repos/*/*/keys (preset github)\n"), "{shown}");

    let file = dir.path().join("scoped.toml");
    let rule = "[[credential]]\nhost = \"api.test\"\nheader = \"authorization\"\nvalue = { env = \"T\" }\n";
    std::fs::write(&file, format!("{rule}methods = [\"get\", \"HEAD\"]\npaths = [\"/repos/\", \"/user\"]\n")).unwrap();
    let out = run(&dir, &["policy", "show", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("from env T, guest T, only for GET, HEAD requests under /repos/, /user\n"), "{shown}");

    std::fs::write(&file, format!("{rule}paths = [\"/repos/../user\"]\n")).unwrap();
    let out = run(&dir, &["policy", "check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{}:5:10:", file.display())) && err.contains(". and .. segments"), "{err}");
    std::fs::write(&file, "[network]\ndeny = [\"api.test/user/%6beys\"]\n").unwrap();
    let out = run(&dir, &["policy", "check", file.to_str().unwrap()]);
    assert!(text(&out.stderr).contains("write the path decoded"), "{}", text(&out.stderr));
    std::fs::write(&file, "[network]\nallow = [\"api.test/x\"]\n").unwrap();
    let out = run(&dir, &["policy", "check", file.to_str().unwrap()]);
    assert!(text(&out.stderr).contains("only deny rules can name a path"), "{}", text(&out.stderr));
}

#[test]
fn log_prints_the_latest_session() {
    let dir = TempDir::new("log");
    let out = run(&dir, &["log"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("no sessions yet"), "{}", text(&out.stderr));
    let session = dir.path().join("data/sessions/20260102-030405-abcd");
    std::fs::create_dir_all(&session).unwrap();
    std::fs::write(
        session.join("network.jsonl"),
        "{\"time\":\"2026-01-02T03:04:06.000Z\",\"kind\":\"connect\",\"host\":\"example.com\",\"port\":443,\
         \"decision\":\"deny\",\"reason\":\"not in the policy\"}\n",
    )
    .unwrap();
    let out = run(&dir, &["log"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = text(&out.stdout);
    assert!(log.contains("03:04:06  DENY  connect  example.com:443  not in the policy"), "{log}");
}

#[test]
fn policy_learn_writes_a_policy_that_policy_check_accepts() {
    let dir = TempDir::new("learn");
    let session = dir.path().join("data/sessions/20260102-030405-abcd");
    std::fs::create_dir_all(&session).unwrap();
    let line = |kind: &str, host: &str, port: u16, reason: &str| {
        format!(
            "{{\"time\":\"2026-01-02T03:04:06.000Z\",\"kind\":\"{kind}\",\"host\":\"{host}\",\"port\":{port},\
             \"decision\":\"deny\",\"reason\":\"{reason}\"}}\n"
        )
    };
    std::fs::write(
        session.join("network.jsonl"),
        line("dns", "pypi.org", 0, "not in the policy")
            + &line("connect", "pypi.org", 443, "not in the policy")
            + &line("connect", "db.example.com", 5432, "not in the policy")
            + &line("https", "api.github.com", 443, "denied by api.github.com/gists (github)"),
    )
    .unwrap();
    std::fs::write(session.join("run.json"), r#"{"command":["pip","install","x"]}"#).unwrap();

    let out = run(&dir, &["policy", "learn"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let learned = text(&out.stdout);
    assert!(learned.contains("from session 20260102-030405-abcd"), "{learned}");
    assert!(learned.contains("# (pip install x)."), "{learned}");
    assert!(learned.contains("    \"db.example.com:5432\", # 1 denial: port 5432"), "{learned}");
    assert!(learned.contains("    \"pypi.org\", # 2 denials: DNS, port 443"), "{learned}");
    assert!(learned.contains("#   api.github.com:443: denied by api.github.com/gists (github)"), "{learned}");

    let file = dir.path().join("learned.toml");
    let out = run(&dir, &["policy", "learn", "20260102", "--output", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), learned);
    let out = run(&dir, &["policy", "check", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok (2 allow"), "{}", text(&out.stdout));

    let out = run(&dir, &["policy", "learn", "--output", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125), "an existing file is never overwritten");
    assert!(text(&out.stderr).contains("give a new file's path to --output"), "{}", text(&out.stderr));

    std::fs::write(session.join("network.jsonl"), line("https", "api.github.com", 443, "denied by x (y)")).unwrap();
    let out = run(&dir, &["policy", "learn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("denied nothing that an allow rule would lift"), "{}", text(&out.stderr));
}

/// At default verbosity a warning reads `stockade: warning: ...`, without the
/// tracing format (timestamp, level column, colour); `-v` brings that back.
/// The warning comes from building the run's configuration, before any VM:
/// the kernel path is missing, so the run fails right after.
#[test]
fn warnings_are_plain_at_default_verbosity() {
    let dir = TempDir::new("plain-warning");
    let file = dir.path().join("pass.toml");
    std::fs::write(&file, "[env]\npass = [\"STOCKADE_TEST_INDEX_URL\"]\n").unwrap();
    let run_with = |verbose: bool| {
        let mut args = vec!["run", "--policy", file.to_str().unwrap(), "--", "true"];
        if verbose {
            args.insert(0, "-v");
        }
        std::process::Command::new(stockade_bin())
            .args(&args)
            .current_dir(dir.path())
            .env("STOCKADE_DATA_DIR", dir.path().join("data"))
            .env("STOCKADE_CONFIG_DIR", dir.path().join("config"))
            .env("STOCKADE_KERNEL", dir.path().join("no-such-vmlinux"))
            .env("STOCKADE_TEST_INDEX_URL", "https://me:s3cret@pypi.test/simple")
            .env_remove("RUST_LOG")
            .output()
            .expect("run stockade")
    };
    let err = text(&run_with(false).stderr);
    let line = err.lines().find(|l| l.contains("holds a user name or token")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.starts_with("stockade: warning: STOCKADE_TEST_INDEX_URL: its URL for pypi.test"), "{err}");
    assert!(!err.contains("WARN") && !err.contains('\x1b'), "{err}");

    let err = text(&run_with(true).stderr);
    let line = err.lines().find(|l| l.contains("holds a user name or token")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("WARN") && !line.starts_with("stockade: "), "{err}");
}

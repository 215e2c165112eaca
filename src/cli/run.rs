//! `stockade run`: run a command in a microVM.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use crate::protocol::publish::Published;
use crate::review::{ApplyMode, CodeChoice};
use crate::supervisor::{self, RunConfig, TOOL_VARS};

use super::settings::{Flags, Settings};
use super::{Global, ci, first_run};

/// Options shared by `run` and `shell`: the VM's size, the environment and
/// the terminal. Where a flag is left out, the config file's setting or the
/// default applies (`stockade config show`). The help of a flag over a
/// setting ends with the setting's default, from its definition.
#[derive(Debug, Args)]
#[command(mut_args = super::settings::with_default_shown)]
pub struct VmOptions {
    /// Virtual CPUs for the guest.
    #[arg(long, value_name = "N")]
    cpus: Option<u8>,

    /// Guest memory, e.g. 512M or 2G (memory is only used as the guest
    /// touches it).
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,

    /// Room for the guest's changes to the workspace: the size of the sparse
    /// scratch disk holding them (only what the guest writes takes space).
    #[arg(long, value_name = "SIZE")]
    disk: Option<String>,

    /// What to do with the command's changes to the workspace: ask (on a
    /// terminal; otherwise keep them staged), all (apply what does not
    /// conflict, except files that run code by themselves), none (keep them
    /// staged for `stockade apply`).
    #[arg(long, value_enum, value_name = "MODE")]
    apply: Option<ApplyMode>,

    /// With --apply all: also apply the files that run code by themselves
    /// (git hooks and config, CI, editor, direnv and tool settings; flagged
    /// with ! in the summary). Without it they are held back, staged, and
    /// the summary says how to apply them.
    #[arg(long)]
    include_code: bool,

    /// Network and credential policy: a preset (npm, cargo, pypi, github,
    /// docker, claude, codex, gemini), a name in ~/.config/stockade/policies/, or a TOML file.
    /// Repeat to merge; deny rules always win. Without one, the config
    /// file's `policy` list; without that, nothing is allowed.
    #[arg(long = "policy", value_name = "NAME|PATH")]
    policies: Vec<String>,

    /// Also allow this host (optionally :PORT; 80 and 443 by default).
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    allows: Vec<String>,

    /// Pass the host's VAR to the command, or set VAR=VALUE. Only TERM, LANG
    /// and LC_* are passed by default, plus PATH, HOME, USER and LOGNAME.
    #[arg(short = 'e', long = "env", value_name = "VAR[=VALUE]")]
    env: Vec<String>,

    /// Run the command on a terminal even when stockade's stdin and stdout
    /// are not one (the default is a terminal exactly when they are).
    #[arg(short = 't', long = "tty", conflicts_with = "no_tty")]
    tty: bool,

    /// Never give the command a terminal: separate stdout and stderr pipes.
    #[arg(short = 'T', long = "no-tty")]
    no_tty: bool,

    /// Stop the command after DURATION (e.g. 90s, 10m, 1h; plain numbers
    /// are seconds): it gets SIGTERM, then SIGKILL 10s later, its changes
    /// are kept, and stockade exits with 124, as timeout(1) does.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,

    /// Most processes and threads the command may have at once (a cgroup
    /// limit in the guest; fork bombs fail with EAGAIN).
    #[arg(long, value_name = "N")]
    pids: Option<u32>,

    /// Forward a host port to a port in the guest, e.g. `-p 5173:5173` for
    /// a dev server the host's browser opens at localhost:5173. The host
    /// side listens on loopback (IPv4 and IPv6) unless HOST_ADDR says
    /// otherwise; the server in the guest may listen on 127.0.0.1, ::1 or
    /// 0.0.0.0. Repeatable.
    #[arg(short = 'p', long = "publish", value_name = "[HOST_ADDR:]HOST_PORT:GUEST_PORT")]
    publish: Vec<Published>,

    /// Let the guest reach this port of the host's loopback as
    /// host.stockade.internal:PORT (a database or API running on the host),
    /// and no other host port. Repeatable; `[network] host_ports` in a
    /// policy does the same. Logged like every connection.
    #[arg(long = "host-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    host_ports: Vec<u16>,

    /// Run the VMM without its Landlock and seccomp jail. Only for hosts
    /// whose kernel lacks them (`stockade doctor` tells); the VM boundary
    /// remains, but a VMM bug would expose your files.
    #[arg(long)]
    no_jail: bool,

    /// Do not share your home toolchains. By default the directories on
    /// PATH under your home directory (~/.cargo/bin, ~/.local/bin, an nvm
    /// version) and the install trees their programs live in (rustup's
    /// toolchains, npm packages) are shared read-only; `-v` lists them.
    /// Also `home_tools = false` in the config file.
    #[arg(long)]
    no_home_tools: bool,

    /// Run on a root filesystem image (`stockade image build NAME` first)
    /// instead of this host's /usr, /etc and friends: the same tools every
    /// time, on any host. The workspace is shared as usual.
    #[arg(long, value_name = "NAME")]
    image: Option<String>,

    /// Start dockerd in the guest before the command (needs --image with
    /// Docker, e.g. `stockade image build docker`, then `--image docker`).
    /// Its data lives on the scratch disk; pulls go through the egress
    /// proxy, so the policy must allow the registry (`--policy docker` for
    /// Docker Hub).
    #[arg(long)]
    docker: bool,

    /// Boot the guest kernel instead of resuming a template of it. The
    /// first run of each VM shape boots and records a template (the guest
    /// saved just before it takes its command); later runs of that shape
    /// resume it, which is faster. `stockade cache` lists the templates.
    #[arg(long)]
    no_snapshot: bool,

    /// Boot this guest kernel (a PVH vmlinux) instead of the installed one.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,

    /// Extra guest kernel command-line argument (debugging aid).
    #[arg(long = "kernel-arg", value_name = "ARG", hide = true)]
    kernel_args: Vec<String>,
}

/// Run a command inside a fresh microVM
///
/// The workspace (the git root of the current directory, or the directory
/// itself) appears at its own path as a copy-on-write overlay: the
/// command's changes are staged for review, never written directly. The
/// host's system directories are shared read-only; $HOME, /tmp and /run are
/// empty and writable. The exit status is the command's own; 125 means
/// stockade failed, 126 the command is not executable, 127 not found,
/// 128+n it was killed by signal n.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    vm: VmOptions,

    /// For CI: never ask (changes stay staged unless --apply all) and print
    /// a JSON summary of the run as the last line of stdout, or to
    /// --summary FILE.
    #[arg(long)]
    ci: bool,

    /// Write the JSON summary of the run to FILE (replaced atomically)
    /// rather than stdout; also without --ci.
    #[arg(long, value_name = "FILE")]
    summary: Option<PathBuf>,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

pub fn run(args: RunArgs, global: Global) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    supervisor::reached("arguments read");
    let (report, summary_file) = (args.ci || args.summary.is_some(), args.summary.clone());
    let ci_mode = args.ci;
    let command: Vec<String> = args.command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let docker = args.vm.docker;
    let mut review = ci::Review::default();
    let result = prepare(args, global).and_then(|config| {
        review = ci::Review { apply_all: config.apply == ApplyMode::All, code: config.code.clone() };
        // Old sessions go while this one starts; pruning never takes a
        // session that is running (this one included).
        let pruning = std::thread::Builder::new().name("prune".into()).spawn(super::sessions::prune_before_run);
        let finished = supervisor::run(config);
        if let Ok(pruning) = pruning {
            let _ = pruning.join();
        }
        finished
    });
    if let Ok(finished) = &result {
        explain_refusals(finished, docker);
    }
    if report {
        ci::write(&ci::RunSummary::of(&command, &result, started.elapsed(), &review), summary_file.as_deref())?;
    }
    let finished = result?;
    supervisor::reached("run reported");
    Ok(ExitCode::from(if ci_mode { ci::exit_code(&finished) } else { finished.status }))
}

/// Names the destinations the policy refused, and how to allow them: in
/// the guest a refusal can look like any network fault (and a refused
/// Docker pull reaches the user only as Docker's terse "Forbidden").
fn explain_refusals(finished: &supervisor::Finished, docker: bool) {
    let Ok(counts) = ci::network(&finished.session_dir.join(crate::protocol::audit::AUDIT_FILE)) else { return };
    let refused = refused_destinations(&counts.denied_hosts);
    if refused.is_empty() {
        return;
    }
    let shown = crate::util::text::display_bytes(refused.join(", ").as_bytes());
    if docker {
        eprintln!(
            "stockade: the policy refused {shown}: Docker's pulls go through the egress proxy, so allow the \
             registry with --allow HOST[:PORT] or a policy (--policy docker for Docker Hub)"
        );
    } else {
        eprintln!(
            "stockade: the policy refused {shown} (`stockade log --denied` shows each refusal; \
             `stockade policy learn` writes a policy that allows them)"
        );
    }
}

/// The audit's denied destinations for people: a refused DNS lookup
/// (`name:0`) shows as the name, unless a refused connection to that name
/// already says it.
fn refused_destinations(denied: &[String]) -> Vec<String> {
    let mut shown = Vec::new();
    for entry in denied {
        match entry.strip_suffix(":0") {
            Some(name) if denied.iter().any(|d| d != entry && d.starts_with(&format!("{name}:"))) => {}
            Some(name) => shown.push(name.to_string()),
            None => shown.push(entry.clone()),
        }
    }
    shown
}

/// The validated run: the command line over the config file.
fn prepare(args: RunArgs, global: Global) -> anyhow::Result<RunConfig> {
    let argv = args
        .command
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.to_str().map(str::to_owned).with_context(|| format!("command argument {} is not valid UTF-8", i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let settings = Settings::load()?.with_flags(Flags { color: global.color, ..Flags::default() })?;
    let apply_flag = args.vm.apply;
    let mut config =
        validate(args.vm, settings, argv, &[], global.verbose, |name| std::env::var_os(name), std::env::vars_os())?;
    if args.ci {
        config.apply = ci::apply_mode(apply_flag)?;
        check_include_code(config.code.include_code, config.apply)?;
    } else {
        first_run::show_once();
    }
    Ok(config)
}

/// One host address and port serves one guest port.
fn check_published(ports: &[Published]) -> anyhow::Result<()> {
    for (i, port) in ports.iter().enumerate() {
        let overlaps = |other: &Published| {
            other.host_port == port.host_port
                && (other.addr.is_none() || port.addr.is_none() || other.addr == port.addr)
        };
        if let Some(other) = ports[..i].iter().find(|other| overlaps(other)) {
            bail!(
                "-p: host port {} is published twice (to guest ports {} and {}): give each its own host port",
                port.host_port,
                other.guest_port,
                port.guest_port
            );
        }
    }
    Ok(())
}

/// Turns what the user typed into a RunConfig without touching the system.
/// `settings` are the config file's (flags override them); `extra_env`
/// names host variables the subcommand itself passes (SHELL).
pub fn validate(
    vm: VmOptions,
    settings: Settings,
    argv: Vec<String>,
    extra_env: &[&str],
    verbose: u8,
    getenv: impl Fn(&str) -> Option<OsString>,
    all_env: impl Iterator<Item = (OsString, OsString)>,
) -> anyhow::Result<RunConfig> {
    let settings = settings.with_flags(Flags {
        policy: &vm.policies,
        cpus: vm.cpus,
        memory: vm.memory.as_deref(),
        disk: vm.disk.as_deref(),
        apply: vm.apply,
        color: None,
        no_home_tools: vm.no_home_tools,
    })?;
    check_include_code(vm.include_code, settings.apply.value)?;
    let timeout =
        vm.timeout.as_deref().map(|t| parse_duration(t).with_context(|| format!("--timeout {t}"))).transpose()?;
    if vm.pids == Some(0) {
        bail!("--pids 0 would not even let the command start: give at least 1 (e.g. --pids 512)");
    }
    if vm.docker && vm.image.is_none() {
        bail!(
            "--docker needs --image: Docker runs in an image that has it, not on the host's system. \
             Build one with `stockade image build docker`, then run with `--image docker --docker`"
        );
    }
    if argv.first().is_none_or(|a| a.is_empty()) {
        bail!("the command is empty");
    }
    check_published(&vm.publish)?;
    let mut policy = settings.resolve_policy(&vm.allows)?;
    for port in vm.host_ports.iter().filter_map(|p| crate::policy::Port::new(*p)) {
        policy.add_host_port(port, "--host-port");
    }
    let mut requested: Vec<String> = extra_env.iter().map(|s| s.to_string()).collect();
    if settings.home_tools.value {
        // Only those set: the rest would be noted as missing, as -e does.
        requested.extend(TOOL_VARS.iter().filter(|v| getenv(v).is_some()).map(|v| v.to_string()));
    }
    // As NAME=VALUE: the policy's variables lose any token in their URLs.
    let passed = policy.passed_env(|name| getenv(name).and_then(|v| v.into_string().ok()));
    requested.extend(passed.into_iter().map(|(name, value)| format!("{name}={value}")));
    requested.extend(vm.env.iter().cloned());
    Ok(RunConfig {
        argv,
        env: guest_env(&requested, getenv, all_env)?,
        cpus: settings.cpus.value,
        memory_bytes: settings.memory.value.bytes,
        disk_bytes: settings.disk.value.bytes,
        package_cache_bytes: settings.package_cache.value.bytes,
        agent_state_bytes: settings.agent_state.value.bytes,
        apply: settings.apply.value,
        code: CodeChoice {
            include_code: vm.include_code,
            runs_code: settings.runs_code.value.clone(),
            agent_settings: false,
        },
        color: settings.color.value,
        policy,
        timeout,
        pids: vm.pids,
        publish: vm.publish,
        jail: !vm.no_jail,
        home_tools: settings.home_tools.value,
        image: vm.image,
        docker: vm.docker,
        kernel: vm.kernel,
        kernel_args: vm.kernel_args,
        verbose_kernel: verbose > 0,
        snapshot: !vm.no_snapshot,
        tty: if vm.tty {
            Some(true)
        } else if vm.no_tty {
            Some(false)
        } else {
            None
        },
    })
}

/// `--include-code` says what "apply all" includes: alone it would do
/// nothing, which the user should hear rather than guess.
fn check_include_code(include_code: bool, mode: ApplyMode) -> anyhow::Result<()> {
    if include_code && mode != ApplyMode::All {
        bail!(
            "--include-code goes with --apply all (it lets \"all\" include the files that run code by \
             themselves); add --apply all, or apply them later with `stockade apply SESSION --include-code`"
        );
    }
    Ok(())
}

/// The command's environment: identity and search path, the terminal and
/// locale, and exactly what -e names.
fn guest_env(
    requested: &[String],
    getenv: impl Fn(&str) -> Option<OsString>,
    all_env: impl Iterator<Item = (OsString, OsString)>,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    };
    let host = |name: &str| getenv(name).and_then(|v| v.into_string().ok());
    set("PATH", host("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()));
    for name in ["HOME", "USER", "LOGNAME", "TERM", "COLORTERM", "LANG", "LANGUAGE"] {
        if let Some(v) = host(name) {
            set(name, v);
        }
    }
    for (k, v) in all_env {
        if let (Some(k), Some(v)) = (k.to_str(), v.to_str()) {
            if k.starts_with("LC_") {
                set(k, v.to_string());
            }
        }
    }
    for item in requested {
        match item.split_once('=') {
            Some((name, value)) => {
                check_var_name(name)?;
                set(name, value.to_string());
            }
            None => {
                check_var_name(item)?;
                match host(item) {
                    Some(v) => set(item, v),
                    None => tracing::info!("-e {item}: not set on the host, not passed"),
                }
            }
        }
    }
    Ok(env)
}

fn check_var_name(name: &str) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        bail!("-e {name}: not a valid variable name (letters, digits and _, not starting with a digit)");
    }
    Ok(())
}

/// A duration as timeout(1) takes it: a number, optionally fractional,
/// with s (the default), m, h or d.
pub fn parse_duration(text: &str) -> anyhow::Result<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 =
        num.parse().map_err(|_| anyhow::anyhow!("not a duration; use a number with a unit, like 90s or 10m"))?;
    let seconds = match unit {
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => bail!("unknown duration unit {other:?}; use s, m, h or d"),
    };
    let total = value * seconds;
    if !total.is_finite() || total <= 0.0 || total > 365.0 * 86400.0 {
        bail!("the duration must be more than 0 and at most a year");
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> VmOptions {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            vm: VmOptions,
        }
        let mut argv = vec!["t"];
        argv.extend_from_slice(extra);
        T::try_parse_from(argv).unwrap().vm
    }

    fn check(extra: &[&str]) -> anyhow::Result<RunConfig> {
        let settings = Settings::defaults(PathBuf::from("/nonexistent/config.toml"));
        validate(args(extra), settings, vec!["true".into()], &[], 0, |_| None, std::iter::empty())
    }

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn durations_read_like_timeout_1() {
        use std::time::Duration;
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        for bad in ["", "0", "-1", "5x", "s", "1e9d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        let err = check(&["--timeout", "soon"]).unwrap_err();
        assert!(format!("{err:#}").contains("--timeout soon"), "{err:#}");
        assert!(check(&["--pids", "0"]).is_err());
    }

    #[test]
    fn include_code_goes_with_apply_all() {
        let err = format!("{:#}", check(&["--include-code"]).unwrap_err());
        assert!(err.contains("--include-code goes with --apply all"), "{err}");
        assert!(check(&["--apply", "none", "--include-code"]).is_err());
        let config = check(&["--apply", "all", "--include-code"]).unwrap();
        assert!(config.code.include_code && config.apply == ApplyMode::All);
        assert!(!check(&["--apply", "all"]).unwrap().code.include_code);
    }

    #[test]
    fn docker_without_an_image_names_the_image_to_build() {
        let err = format!("{:#}", check(&["--docker"]).unwrap_err());
        assert!(err.contains("--docker needs --image") && err.contains("stockade image build docker"), "{err}");
        let config = check(&["--image", "docker", "--docker"]).unwrap();
        assert!(config.docker && config.image.as_deref() == Some("docker"));
        assert!(!check(&[]).unwrap().docker);
    }

    #[test]
    fn refused_lookups_are_named_once() {
        let denied: Vec<String> =
            ["evil.test:0", "registry.test:0", "registry.test:8443"].iter().map(|s| s.to_string()).collect();
        assert_eq!(refused_destinations(&denied), ["evil.test", "registry.test:8443"]);
    }

    #[test]
    fn zero_memory_is_refused_with_a_hint() {
        let err = check(&["--memory", "0"]).unwrap_err();
        assert!(format!("{err:#}").contains("at least 128M"), "{err:#}");
    }

    #[test]
    fn tiny_disk_is_refused_with_a_hint() {
        let err = check(&["--disk", "1M"]).unwrap_err();
        assert!(format!("{err:#}").contains("at least 64M"), "{err:#}");
        assert_eq!(check(&[]).unwrap().disk_bytes, 8 << 30);
    }

    #[test]
    fn cpus_out_of_range_is_refused() {
        assert!(check(&["--cpus", "0"]).is_err());
        assert!(check(&["--cpus", "99"]).is_err());
    }

    #[test]
    fn tty_flags_decide_or_leave_it_to_the_terminal() {
        assert_eq!(check(&[]).unwrap().tty, None);
        assert_eq!(check(&["-t"]).unwrap().tty, Some(true));
        assert_eq!(check(&["-T"]).unwrap().tty, Some(false));
    }

    #[test]
    fn passes_only_the_default_and_named_variables() {
        let host = [("PATH", "/usr/bin"), ("TERM", "xterm"), ("SECRET", "s3"), ("FOO", "bar"), ("HOME", "/home/a")];
        let all = host
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .chain([(OsString::from("LC_ALL"), OsString::from("C"))]);
        let env = guest_env(&["FOO".into(), "X=1".into()], env_of(&host), all).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("TERM"), Some("xterm"));
        assert_eq!(get("LC_ALL"), Some("C"));
        assert_eq!(get("FOO"), Some("bar"));
        assert_eq!(get("X"), Some("1"));
        assert_eq!(get("SECRET"), None);
    }

    #[test]
    fn policy_variables_reach_the_guest_without_url_tokens() {
        let host =
            [("PIP_INDEX_URL", "https://__token__:pypi-S3CRET@pypi.corp/simple"), ("CUSTOM", "https://u:p@c.test")];
        let settings = Settings::defaults(PathBuf::from("/nonexistent/config.toml"));
        let config = validate(
            args(&["--policy", "pypi", "-e", "CUSTOM"]),
            settings,
            vec!["true".into()],
            &[],
            0,
            env_of(&host),
            std::iter::empty(),
        )
        .unwrap();
        let get = |k: &str| config.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PIP_INDEX_URL"), Some("https://pypi.corp/simple"));
        // What -e names explicitly is passed as it is.
        assert_eq!(get("CUSTOM"), Some("https://u:p@c.test"));
    }

    #[test]
    fn bad_variable_names_are_refused() {
        assert!(guest_env(&["1X=2".into()], |_| None, std::iter::empty()).is_err());
        assert!(guest_env(&["A-B".into()], |_| None, std::iter::empty()).is_err());
    }
}

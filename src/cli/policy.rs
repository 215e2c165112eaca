//! `stockade policy`: list, show and check network policies.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::paths::Dirs;
use crate::policy::{self, presets};
use crate::proxy::standalone;

/// List, show or check network policies
///
/// A policy says which hosts the command may reach, which credentials the
/// proxy writes for it, and which host directories and variables it gets.
/// `--policy NAME` looks for ~/.config/stockade/policies/NAME.toml, then
/// for a preset of that name; a path names a file. Several policies merge;
/// a deny rule always wins over an allow rule.
///
/// The format (TOML; unknown keys are errors):
///
///   description = "one line for `stockade policy list`"
///
///   [network]
///   allow = ["registry.npmjs.org", "*.crates.io", "github.com:443", "10.0.0.5:8080"]
///   deny = ["gist.github.com", "api.github.com/gists", "api.github.com/repos/*/*/keys"]
///   allow_private = ["localhost:4873"]
///   host_ports = [5432]   # this machine's loopback, as host.stockade.internal:5432
///
///   [network.hosts]
///   "registry.test" = "192.168.1.20"
///
///   [[credential]]
///   host = "api.anthropic.com"
///   header = "x-api-key"
///   value = { env = "ANTHROPIC_API_KEY" }
///   format = "{}"
///   methods = ["GET", "POST"]
///   paths = ["/v1/"]
///
///   [[signin]]
///   file = "~/.claude/.credentials.json"
///   tokens = ["claudeAiOauth.accessToken", "claudeAiOauth.refreshToken"]
///   hosts = ["api.anthropic.com", "platform.claude.com"]
///   token_urls = ["https://platform.claude.com/v1/oauth/token"]
///
///   [mounts]
///   "~/.claude" = "rw"
///
///   [env]
///   pass = ["NODE_OPTIONS"]
///
/// Rules are HOST[:PORT]: `*.example.com` matches subdomains (not
/// example.com itself), `*` any name. Without a port an allow rule means 80
/// and 443, a deny rule every port. IP addresses are only reached through a
/// rule that names them. A name that resolves to a loopback, private,
/// link-local or metadata address is refused unless it is in allow_private
/// (for a registry on this machine or your network). [network.hosts] gives
/// names a fixed address instead of asking DNS.
///
/// A deny rule HOST[:PORT]/PATH refuses requests under PATH on that host
/// (no port: 80 and 443) with a 403 naming the rule; the host stays
/// allowed, and its TLS is intercepted as for a credential so the proxy
/// reads each request. PATH is a prefix of the path as text (/gists also
/// matches /gists/1; end it with / for whole segments), `*` stands for one
/// whole segment, letters match in any case, and it is written decoded.
/// The guest's path is judged in every reading a server might give it
/// (escapes decoded, %2F and \ as separators or not, ;params, dot
/// segments, //): a deny rule refuses it if any reading matches.
///
/// A credential rule (host, port 443 unless given) makes the proxy end TLS
/// for that host with its own CA, check the real server's certificate, drop
/// the Authorization header and the rule's header sent from the guest, and
/// write the rule's header with the value from `env`, `file`, or `command`
/// (re-run after `ttl`, e.g. { command = "gh auth token", ttl = "55m" }).
/// The guest sees only a placeholder in `guest_env` (by default the `env`
/// variable). `optional = true` skips a rule whose value is missing.
/// `methods` and `paths` (patterns as for deny rules) limit the requests
/// the header is written for: others are sent without it, and without the
/// guest's own. A request is covered only if its method and any method an
/// X-HTTP-Method-Override header names are listed, and every reading of
/// its path is under a listed prefix.
///
/// A signin rule keeps a coding agent's subscription sign-in on the host:
/// the guest's copy of `file` (JSON) holds placeholders at the `tokens`
/// paths. On `hosts` (intercepted as for credentials) the proxy writes the
/// real access token in the Authorization header and scrubs every real
/// value from the answers; only a refresh POSTed to one of `token_urls`
/// gets the real refresh token (in its refresh_token field), and only
/// that endpoint's answers get placeholders for their tokens and may write
/// refreshed tokens back to `file`. Its hosts must also be allowed.
///
/// [env] pass gives the guest these host variables, with the user name and
/// password of any URL in them removed (https://user:TOKEN@host/ becomes
/// https://host/); -e VAR passes a variable as it is.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// List your policies and the presets.
    List,
    /// Show what policies allow, merged as `stockade run` would merge them.
    Show {
        /// Policy names or paths (none: the default policy).
        #[arg(value_name = "NAME|PATH")]
        names: Vec<String>,
        /// Extra hosts, as with `stockade run --allow`.
        #[arg(long, value_name = "HOST[:PORT]")]
        allow: Vec<String>,
        /// Print the policy file itself instead (one name).
        #[arg(long)]
        toml: bool,
    },
    /// Check policy files for errors.
    Check {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Write the policy that would have allowed what a session was denied.
    ///
    /// Reads the session's network log and prints a policy file that allows
    /// exactly the hosts and ports refused for want of a rule (exact hosts,
    /// never wildcards), each with what was denied. Refusals by deny rules,
    /// and those no allow rule lifts, are listed as comments only. Review
    /// it, save it, and pass it beside your other policies:
    /// `stockade run --policy ./learned.toml ...`.
    Learn {
        /// The session id, or a unique start of it (default: the latest session).
        #[arg(value_name = "SESSION")]
        session: Option<String>,
        /// Write the policy to FILE (which must not exist yet) instead of printing it.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Debugging aid: run the proxy on this host with these policies until
    /// SIGINT/SIGTERM, and print the variables to point a shell's tools at
    /// it. Host programs are not sandboxed: this only shows what the policy
    /// allows and what the proxy writes.
    #[command(hide = true)]
    Serve {
        #[arg(value_name = "NAME|PATH")]
        names: Vec<String>,
        #[arg(long, value_name = "HOST[:PORT]")]
        allow: Vec<String>,
        /// Proxy address (host:port) or Unix socket path.
        #[arg(long, default_value = "127.0.0.1:3128")]
        listen: String,
        /// Also answer DNS: over UDP at HOST:PORT, or over a Unix socket
        /// PATH (TCP framing).
        #[arg(long, value_name = "HOST:PORT|PATH")]
        dns: Option<String>,
        /// Write the audit log here.
        #[arg(long, value_name = "FILE")]
        audit: Option<PathBuf>,
    },
}

pub fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PolicyCommand::List => print!("{}", list()),
        PolicyCommand::Show { names, toml: true, .. } => {
            let [name] = names.as_slice() else { anyhow::bail!("--toml shows one policy: give one name or path") };
            print!("{}", source_text(name)?);
        }
        PolicyCommand::Show { names, allow, toml: false } => {
            print!("{}", policy::resolve(&names, &allow)?.describe());
        }
        PolicyCommand::Check { files } => {
            for file in files {
                let policy = policy::load_file(&file)?;
                println!("{}: ok ({})", file.display(), policy.counts());
            }
        }
        PolicyCommand::Learn { session, output } => return learn(session.as_deref(), output.as_deref()),
        PolicyCommand::Serve { names, allow, listen, dns, audit } => {
            let policy = policy::resolve(&names, &allow)?;
            standalone::serve(policy, &Dirs::resolve()?.data, &listen, dns, audit)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `policy learn`: exits 1, writing nothing, when no denial is learnable.
fn learn(session: Option<&str>, output: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    use crate::policy::learn::Lessons;
    let sessions = Dirs::resolve()?.data.join("sessions");
    let dir = crate::session::lookup::find_session(&sessions, session)?;
    let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let log = dir.join(crate::protocol::audit::AUDIT_FILE);
    let records = if log.exists() {
        crate::proxy::audit::read(&log).with_context(|| format!("cannot read {}", log.display()))?.0
    } else {
        Vec::new()
    };
    let lessons = Lessons::from_records(&records);
    if lessons.is_empty() {
        eprintln!(
            "stockade: session {id} was denied nothing that an allow rule would lift; no policy written \
             (`stockade log {id} --denied` shows its refusals)"
        );
        return Ok(ExitCode::from(1));
    }
    let text = lessons.render(&id, &run_command(&dir));
    match output {
        None => print!("{text}"),
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("cannot create {}; give a new file's path to --output", path.display()))?;
            std::io::Write::write_all(&mut file, text.as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "stockade: wrote {}; review it, then: stockade run --policy {} ...",
                path.display(),
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The session's command as its run record has it, for the learned
/// policy's header; empty when the record cannot be read.
fn run_command(dir: &std::path::Path) -> String {
    let record = std::fs::read(dir.join("run.json")).ok();
    let value: Option<serde_json::Value> = record.and_then(|r| serde_json::from_slice(&r).ok());
    let words = value.as_ref().and_then(|v| v.get("command")).and_then(|c| c.as_array()).cloned();
    words.unwrap_or_default().iter().filter_map(|w| w.as_str()).collect::<Vec<_>>().join(" ")
}

fn list() -> String {
    let mut out = String::new();
    let mut shadowing = Vec::new();
    if let Some(dir) = policy::user_policy_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect()
            })
            .unwrap_or_default();
        files.sort();
        if !files.is_empty() {
            let _ = writeln!(out, "Your policies ({}):", dir.display());
        }
        for path in files {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let about = match policy::load_file(&path) {
                Ok(p) => p.description.unwrap_or_default(),
                Err(e) => format!("ERROR: {e}"),
            };
            let _ = writeln!(out, "  {name:<10} {about}");
            shadowing.push(name);
        }
        if !out.is_empty() {
            out.push('\n');
        }
    }
    out.push_str("Presets:\n");
    for name in presets::NAMES {
        let text = presets::get(name).unwrap_or_default();
        let about = policy::parse(text, name).ok().and_then(|p| p.description).unwrap_or_default();
        let note = if shadowing.iter().any(|s| s == name) { " (yours is used instead)" } else { "" };
        let _ = writeln!(out, "  {name:<10} {about}{note}");
    }
    out
}

fn source_text(name: &str) -> anyhow::Result<String> {
    if !policy::is_path(name) {
        if let Some(dir) = policy::user_policy_dir() {
            let path = dir.join(format!("{name}.toml"));
            if path.exists() {
                return std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()));
            }
        }
        if let Some(text) = presets::get(name) {
            return Ok(text.to_string());
        }
    }
    std::fs::read_to_string(name).with_context(|| format!("cannot read the policy {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_preset() {
        let text = list();
        for name in presets::NAMES {
            assert!(text.contains(&format!("  {name:<10} ")), "{name} missing from {text}");
        }
    }
}

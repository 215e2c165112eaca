//! The user's defaults for `run` and `shell`, from `config.toml` in
//! stockade's config directory (`$XDG_CONFIG_HOME/stockade`, usually
//! `~/.config/stockade`), with the flags over them: each effective setting,
//! validated, and where it came from (`stockade config show`).
//!
//! The file is flat TOML:
//!
//! ```toml
//! policy = ["npm", "github"]
//! cpus = 4
//! memory = "4G"
//! disk = "16G"
//! apply = "ask"     # ask | all | none
//! color = "auto"    # auto | always | never
//! home_tools = true # share the toolchains on PATH under ~ read-only
//! keep_sessions = 100 # finished sessions kept (none staged), newest first
//! keep_days = 14      # and none older than this
//! runs_code = ["tools/*.sh", "scripts/git-hooks/"] # also flagged in review
//! package_cache = "5G" # checked registry downloads kept on the host; "0" turns it off
//! agent_state = "4G"   # what each agent's state directory may come to hold
//! ```
//!
//! `runs_code` adds gitignore-style patterns to the built-in list of files
//! that run code by themselves (`review::FLAGGED`): such files are
//! flagged in the review and held back from `--apply all`. It can only add;
//! nothing built in can be un-flagged, and there is no setting for
//! `--include-code`, which must be said each time.
//!
//! Unknown keys and bad values are errors naming the file, line and key, so
//! a typo never silently leaves a default in place.
//!
//! Each setting is one entry in [`DEFINITIONS`]: its key, what to write
//! instead of a value of the wrong type, how a value is checked and set,
//! its flag, and how `config show` prints it. Parsing, the flags, `config
//! show` and the list of known keys all go through that table, so adding a
//! setting is an entry there, a field in [`Settings`] with its default and,
//! if a flag overrides it, a field in [`Flags`] and the flag in
//! `run::VmOptions`, whose help gets the default from here
//! ([`with_default_shown`]); a test fails if the flag is missing there.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use thiserror::Error;
use toml::{Spanned, Value};

use crate::policy::{Policy, PolicyError, line_column};
use crate::protocol::limits::MAX_VCPUS;
use crate::review::ApplyMode;
use crate::session::retention::{self, Retention};
use crate::util::color::ColorChoice;

/// The config file's name in the config directory.
pub const FILE_NAME: &str = "config.toml";

/// Smallest guest memory that boots our kernel and a shell with room to work.
const MIN_MEMORY: u64 = 128 << 20;
/// Smallest scratch disk worth formatting: room for the filesystem's own
/// metadata and a few changes.
const MIN_DISK: u64 = 64 << 20;
/// Smallest bound on an agent's state directory: its settings and sign-in
/// files with room to spare.
const MIN_AGENT_STATE: u64 = 16 << 20;

/// One setting: how it is read, overridden, shown and explained.
struct Definition {
    /// Its key in the file (and its field in `Settings`).
    key: &'static str,
    /// What the key takes, for a value of the wrong type.
    expected: &'static str,
    /// Checks a value and sets it with its source. A flag's value comes
    /// here too, as the file would write it, so it is checked the same way.
    read: fn(&mut Settings, &Value, Source) -> Result<(), Refusal>,
    /// The command-line flag over the setting, if there is one.
    flag: Option<Flag>,
    /// The value as TOML, for `config show`, and where it came from.
    show: fn(&Settings) -> (String, Source),
}

struct Flag {
    /// As typed, `--cpus`; a test checks `run` and `shell` have it.
    name: &'static str,
    /// Whether the flag's help ends with the setting's default, as
    /// `[default: 2G]` (see `with_default_shown`): not for a switch that
    /// only turns the setting off, nor a list the help explains in words.
    shows_default: bool,
    /// The flag's value if it was given, as the file would write it.
    given: fn(&Flags<'_>) -> Option<Value>,
}

/// The settings, in the order `config show` prints them.
const DEFINITIONS: &[Definition] = &[
    Definition {
        key: "policy",
        expected: "give a list of policy names or paths, e.g. policy = [\"npm\"]",
        read: |s, value, source| s.policy.set(policy_names(value, source), source),
        flag: Some(Flag {
            name: "--policy",
            shows_default: false,
            given: |f| (!f.policy.is_empty()).then(|| Value::from(f.policy.to_vec())),
        }),
        show: |s| s.policy.shown(|names| list(names)),
    },
    Definition {
        key: "cpus",
        expected: "give a number, e.g. cpus = 4",
        read: |s, value, source| s.cpus.set(integer(value).and_then(check_cpus), source),
        flag: Some(Flag { name: "--cpus", shows_default: true, given: |f| f.cpus.map(|n| Value::from(i64::from(n))) }),
        show: |s| s.cpus.shown(u8::to_string),
    },
    Definition {
        key: "memory",
        expected: "give a size in quotes, e.g. memory = \"4G\"",
        read: |s, value, source| s.memory.set(string(value).and_then(check_memory), source),
        flag: Some(Flag { name: "--memory", shows_default: true, given: |f| f.memory.map(Value::from) }),
        show: |s| s.memory.shown(|size| quoted(&size.text)),
    },
    Definition {
        key: "disk",
        expected: "give a size in quotes, e.g. disk = \"16G\"",
        read: |s, value, source| s.disk.set(string(value).and_then(check_disk), source),
        flag: Some(Flag { name: "--disk", shows_default: true, given: |f| f.disk.map(Value::from) }),
        show: |s| s.disk.shown(|size| quoted(&size.text)),
    },
    Definition {
        key: "apply",
        expected: "give \"ask\", \"all\" or \"none\"",
        read: |s, value, source| s.apply.set(string(value).and_then(|text| choice(text, "ask, all or none")), source),
        flag: Some(Flag {
            name: "--apply",
            shows_default: true,
            given: |f| f.apply.map(|mode| Value::from(value_name(mode))),
        }),
        show: |s| s.apply.shown(|&mode| quoted(&value_name(mode))),
    },
    Definition {
        key: "color",
        expected: "give \"auto\", \"always\" or \"never\"",
        read: |s, value, source| {
            s.color.set(string(value).and_then(|text| choice(text, "auto, always or never")), source)
        },
        flag: Some(Flag {
            name: "--color",
            shows_default: false,
            given: |f| f.color.map(|choice| Value::from(value_name(choice))),
        }),
        show: |s| s.color.shown(|&choice| quoted(&value_name(choice))),
    },
    Definition {
        key: "home_tools",
        expected: "give true or false, e.g. home_tools = false",
        read: |s, value, source| s.home_tools.set(value.as_bool().ok_or(Refusal::WrongType), source),
        flag: Some(Flag {
            name: "--no-home-tools",
            shows_default: false,
            given: |f| f.no_home_tools.then_some(Value::Boolean(false)),
        }),
        show: |s| s.home_tools.shown(bool::to_string),
    },
    Definition {
        key: "keep_sessions",
        expected: "give a number, e.g. keep_sessions = 100",
        read: |s, value, source| s.keep_sessions.set(integer(value).and_then(check_keep_sessions), source),
        flag: None,
        show: |s| s.keep_sessions.shown(u32::to_string),
    },
    Definition {
        key: "keep_days",
        expected: "give a number of days, e.g. keep_days = 14",
        read: |s, value, source| s.keep_days.set(integer(value).and_then(check_keep_days), source),
        flag: None,
        show: |s| s.keep_days.shown(u32::to_string),
    },
    Definition {
        key: "runs_code",
        expected: "give a list of patterns, e.g. runs_code = [\"tools/*.sh\"]",
        read: |s, value, source| s.runs_code.set(patterns(value), source),
        flag: None,
        show: |s| s.runs_code.shown(|patterns| list(patterns)),
    },
    Definition {
        key: "package_cache",
        expected: "give a size in quotes, e.g. package_cache = \"5G\" (\"0\" turns the cache off)",
        read: |s, value, source| {
            s.package_cache.set(string(value).and_then(|text| check_size(text, 0, "", "\"5G\"")), source)
        },
        flag: None,
        show: |s| s.package_cache.shown(|size| quoted(&size.text)),
    },
    Definition {
        key: "agent_state",
        expected: "give a size in quotes, e.g. agent_state = \"8G\"",
        read: |s, value, source| {
            s.agent_state.set(
                string(value).and_then(|text| {
                    check_size(text, MIN_AGENT_STATE, "is too small for an agent's state: give at least 16M", "\"8G\"")
                }),
                source,
            )
        },
        flag: None,
        show: |s| s.agent_state.shown(|size| quoted(&size.text)),
    },
];

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("cannot find stockade's config directory: set HOME or XDG_CONFIG_HOME")]
    NoConfigDir,
    #[error("cannot read the config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Invalid { path: PathBuf, line: usize, column: usize, message: String },
    /// A flag's value, named with the flag.
    #[error("{0}")]
    Flag(String),
    /// The config file's policy list names a policy that cannot be used.
    #[error("{}:{line}: policy", path.display())]
    Policy {
        path: PathBuf,
        line: usize,
        #[source]
        source: Box<PolicyError>,
    },
    #[error(transparent)]
    PolicyFlags(Box<PolicyError>),
}

/// Where an effective setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    /// The config file, at this line.
    File {
        line: usize,
    },
    Flag(&'static str),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File { line } => write!(f, "config file, line {line}"),
            Source::Flag(flag) => f.write_str(flag),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Setting<T> {
    fn default(value: T) -> Setting<T> {
        Setting { value, source: Source::Default }
    }

    /// Takes a checked value from `source`; a refused one changes nothing.
    fn set(&mut self, value: Result<T, Refusal>, source: Source) -> Result<(), Refusal> {
        *self = Setting { value: value?, source };
        Ok(())
    }

    /// The value as `show` writes it, and its source.
    fn shown(&self, show: impl Fn(&T) -> String) -> (String, Source) {
        (show(&self.value), self.source)
    }
}

/// A size as written (`2G`) and in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Size {
    pub text: String,
    pub bytes: u64,
}

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The config file, whether or not it exists.
    pub path: PathBuf,
    pub exists: bool,
    /// `--policy` names or paths; empty means the `default` preset.
    pub policy: Setting<Vec<String>>,
    pub cpus: Setting<u8>,
    pub memory: Setting<Size>,
    pub disk: Setting<Size>,
    pub apply: Setting<ApplyMode>,
    pub color: Setting<ColorChoice>,
    /// Share the home toolchains on PATH (rustup, nvm, ~/.local/bin).
    pub home_tools: Setting<bool>,
    /// Finished sessions with nothing staged kept, newest first.
    pub keep_sessions: Setting<u32>,
    /// Days such a session is kept at most.
    pub keep_days: Setting<u32>,
    /// The user's patterns of files that run code, flagged in review.
    pub runs_code: Setting<Vec<String>>,
    /// The package cache's size; 0 turns it off.
    pub package_cache: Setting<Size>,
    /// What each agent's state directory may hold; the guest's writes past
    /// it fail with ENOSPC.
    pub agent_state: Setting<Size>,
}

/// What the command line gave for the settings; `None` or empty keeps the
/// config file's value or the default.
#[derive(Debug, Default)]
pub struct Flags<'a> {
    pub policy: &'a [String],
    pub cpus: Option<u8>,
    pub memory: Option<&'a str>,
    pub disk: Option<&'a str>,
    pub apply: Option<ApplyMode>,
    pub color: Option<ColorChoice>,
    /// `--no-home-tools`.
    pub no_home_tools: bool,
}

/// Where the config file is: `STOCKADE_CONFIG_DIR` (tests, packagers) or
/// the XDG config directory.
pub fn config_path() -> Result<PathBuf, SettingsError> {
    if let Some(dir) = std::env::var_os("STOCKADE_CONFIG_DIR") {
        return Ok(PathBuf::from(dir).join(FILE_NAME));
    }
    crate::paths::project_dirs().map(|p| p.config_dir().join(FILE_NAME)).ok_or(SettingsError::NoConfigDir)
}

/// The colour choice alone: the flag when given (the file is then not even
/// read), else the config file's.
pub fn color(flag: Option<ColorChoice>) -> Result<ColorChoice, SettingsError> {
    match flag {
        Some(choice) => Ok(choice),
        None => Ok(Settings::load()?.color.value),
    }
}

/// A flag's help with its setting's default appended (`[default: 2G]`)
/// where the definition shows one, so the default is written once, in
/// `Settings::defaults`. clap calls this on each argument of `run` and
/// `shell` as it builds them (`mut_args` on `VmOptions`): parsing, help,
/// the manual pages and the completions all see the same text.
pub fn with_default_shown(arg: clap::Arg) -> clap::Arg {
    let Some(default) = arg.get_long().and_then(shown_default) else { return arg };
    let append = |help: &clap::builder::StyledStr| {
        let mut help = help.clone();
        help.push_str(&format!(" [default: {default}]"));
        help
    };
    let help = arg.get_help().map_or_else(|| format!("[default: {default}]").into(), append);
    match arg.get_long_help().map(append) {
        Some(long_help) => arg.help(help).long_help(long_help),
        None => arg.help(help),
    }
}

/// The default of the setting `--LONG` overrides, written as the flag
/// takes it, if the flag's help shows it.
fn shown_default(long: &str) -> Option<String> {
    let definition = DEFINITIONS.iter().find(|d| {
        d.flag.as_ref().is_some_and(|flag| flag.shows_default && flag.name.strip_prefix("--") == Some(long))
    })?;
    let (value, _) = (definition.show)(&Settings::defaults(PathBuf::new()));
    Some(value.trim_matches('"').to_string())
}

impl Settings {
    /// Every setting at its default.
    pub fn defaults(path: PathBuf) -> Settings {
        let size = |text: &str| Size { text: text.to_string(), bytes: parse_size(text).unwrap_or(0) };
        Settings {
            path,
            exists: false,
            policy: Setting::default(Vec::new()),
            cpus: Setting::default(2),
            memory: Setting::default(size("2G")),
            disk: Setting::default(size("8G")),
            apply: Setting::default(ApplyMode::Ask),
            color: Setting::default(ColorChoice::Auto),
            home_tools: Setting::default(true),
            keep_sessions: Setting::default(retention::DEFAULT_KEEP),
            keep_days: Setting::default(retention::DEFAULT_KEEP_DAYS),
            runs_code: Setting::default(Vec::new()),
            package_cache: Setting::default(size("5G")),
            agent_state: Setting::default(size("4G")),
        }
    }

    /// Reads the user's config file; a missing file means every default.
    /// (See `load_from` for a file we may not even look for.)
    pub fn load() -> Result<Settings, SettingsError> {
        Settings::load_from(config_path()?)
    }

    pub fn load_from(path: PathBuf) -> Result<Settings, SettingsError> {
        match std::fs::read_to_string(&path) {
            Ok(text) => Settings::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Settings::defaults(path)),
            // A directory on the way we may not enter (HOME left pointing at
            // another user's home, as under sudo -u or setpriv): that is not
            // our config, so there is none. An unreadable file of ours is
            // still an error.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !parent_searchable(&path) => {
                tracing::debug!("cannot look into the directory of {}: no config file", path.display());
                Ok(Settings::defaults(path))
            }
            Err(source) => Err(SettingsError::Read { path, source }),
        }
    }

    /// Parses and validates the file's text; `path` names it in errors.
    pub fn parse(text: &str, path: PathBuf) -> Result<Settings, SettingsError> {
        let invalid = |span: Range<usize>, message: String| {
            let (line, column) = line_column(text, span.start);
            SettingsError::Invalid { path: path.clone(), line, column, message }
        };
        let table: BTreeMap<Spanned<String>, Spanned<toml::Value>> = toml::from_str(text).map_err(|err| {
            invalid(err.span().unwrap_or(0..0), format!("{}; fix the TOML syntax", err.message().trim_end()))
        })?;
        let mut entries: Vec<(Range<usize>, &String, &Spanned<toml::Value>)> =
            table.iter().map(|(key, value)| (key.span(), key.get_ref(), value)).collect();
        // Report the first problem in the file, not the first in key order.
        entries.sort_by_key(|(span, _, _)| span.start);

        let mut settings = Settings::defaults(path.clone());
        settings.exists = true;
        for (key_span, key, value) in entries {
            let Some(definition) = DEFINITIONS.iter().find(|d| d.key == key) else {
                let keys: Vec<&str> = DEFINITIONS.iter().map(|d| d.key).collect();
                return Err(invalid(
                    key_span,
                    format!(
                        "unknown setting `{key}`: the settings are {}; remove it or correct its name",
                        keys.join(", ")
                    ),
                ));
            };
            let source = Source::File { line: line_column(text, key_span.start).0 };
            let written = text.get(value.span()).unwrap_or("").trim();
            (definition.read)(&mut settings, value.get_ref(), source)
                .map_err(|refusal| invalid(value.span(), refusal.in_file(definition, written)))?;
        }
        Ok(settings)
    }

    /// The settings with the command line's values over them.
    pub fn with_flags(mut self, flags: Flags<'_>) -> Result<Settings, SettingsError> {
        for definition in DEFINITIONS {
            let Some(flag) = &definition.flag else { continue };
            let Some(value) = (flag.given)(&flags) else { continue };
            (definition.read)(&mut self, &value, Source::Flag(flag.name)).map_err(|refusal| {
                // As typed: a size unquoted, a number as it is.
                let given = value.as_str().map_or_else(|| value.to_string(), str::to_string);
                SettingsError::Flag(refusal.on_flag(definition, flag.name, &given))
            })?;
        }
        Ok(self)
    }

    /// Each setting as `key`, its value in TOML, and its source.
    pub fn entries(&self) -> Vec<(&'static str, String, Source)> {
        DEFINITIONS
            .iter()
            .map(|definition| {
                let (value, source) = (definition.show)(self);
                (definition.key, value, source)
            })
            .collect()
    }

    /// How much of the session store pruning keeps.
    pub fn retention(&self) -> Retention {
        Retention::new(self.keep_sessions.value, self.keep_days.value)
    }

    /// The policy `run` enforces: the effective policy list merged with
    /// the `--allow` flags. Errors from the file's list name its line.
    pub fn resolve_policy(&self, allows: &[String]) -> Result<Policy, SettingsError> {
        crate::policy::resolve(&self.policy.value, allows).map_err(|source| match (self.policy.source, &source) {
            (Source::File { line }, e) if !matches!(e, PolicyError::BadAllow { .. }) => {
                SettingsError::Policy { path: self.path.clone(), line, source: Box::new(source) }
            }
            _ => SettingsError::PolicyFlags(Box::new(source)),
        })
    }
}

/// Why a value was refused.
#[derive(Debug)]
enum Refusal {
    /// Not the TOML type the key takes: its definition says what is.
    WrongType,
    /// A bad value, and a good one to show instead.
    Value { why: String, example: Option<&'static str> },
    /// A bad item of a list, which the message quotes itself.
    Item(String),
}

impl Refusal {
    fn new(why: impl Into<String>, example: Option<&'static str>) -> Refusal {
        Refusal::Value { why: why.into(), example }
    }

    /// `memory = "1K" is too small: ... (e.g. memory = "512M")`.
    fn in_file(self, definition: &Definition, written: &str) -> String {
        let key = definition.key;
        match self {
            Refusal::WrongType => format!("{key} = {written} has the wrong type: {}", definition.expected),
            Refusal::Value { why, example } => {
                let example = example.map(|e| format!(" (e.g. {key} = {e})")).unwrap_or_default();
                format!("{key} = {written} {why}{example}")
            }
            Refusal::Item(why) => format!("{key}: {why}"),
        }
    }

    /// `--memory 1K is too small: ... (e.g. --memory 512M)`.
    fn on_flag(self, definition: &Definition, flag: &str, given: &str) -> String {
        match self {
            Refusal::WrongType => format!("{flag} {given} has the wrong type: {}", definition.expected),
            Refusal::Value { why, example } => {
                let example = example.map(|e| format!(" (e.g. {flag} {})", e.trim_matches('"'))).unwrap_or_default();
                format!("{flag} {given} {why}{example}")
            }
            Refusal::Item(why) => format!("{flag}: {why}"),
        }
    }
}

fn integer(value: &Value) -> Result<i64, Refusal> {
    value.as_integer().ok_or(Refusal::WrongType)
}

fn string(value: &Value) -> Result<&str, Refusal> {
    value.as_str().ok_or(Refusal::WrongType)
}

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

fn list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|item| quoted(item)).collect();
    format!("[{}]", items.join(", "))
}

/// Policy names or paths. A blank one in the file is refused here, at its
/// line; one given to `--policy` is left to the policy loader, which lists
/// the names there are.
fn policy_names(value: &Value, source: Source) -> Result<Vec<String>, Refusal> {
    let items = match value {
        Value::Array(items) => items,
        Value::String(name) => {
            return Err(Refusal::new(format!("must be a list, even of one: write policy = [{name:?}]"), None));
        }
        _ => return Err(Refusal::WrongType),
    };
    let from_flag = matches!(source, Source::Flag(_));
    items
        .iter()
        .map(|item| match item.as_str() {
            Some(name) if from_flag || !name.trim().is_empty() => Ok(name.to_string()),
            _ => Err(Refusal::new("must list policy names or paths as strings", Some("[\"npm\", \"github\"]"))),
        })
        .collect()
}

/// Gitignore-style patterns of files that run code, each checked as the
/// review will use it.
fn patterns(value: &Value) -> Result<Vec<String>, Refusal> {
    let Value::Array(items) = value else { return Err(Refusal::WrongType) };
    items
        .iter()
        .map(|item| {
            let pattern =
                item.as_str().ok_or_else(|| Refusal::new("must list patterns as strings", Some("[\"tools/*.sh\"]")))?;
            crate::review::check_pattern(pattern).map_err(Refusal::Item)?;
            Ok(pattern.to_string())
        })
        .collect()
}

fn check_cpus(n: i64) -> Result<u8, Refusal> {
    match u8::try_from(n) {
        Ok(cpus) if (1..=MAX_VCPUS).contains(&cpus) => Ok(cpus),
        _ => Err(Refusal::new(format!("is out of range: give 1 to {MAX_VCPUS}"), None)),
    }
}

/// Most finished sessions one may ask to keep; more is a store nobody prunes.
const MAX_KEEP_SESSIONS: u32 = 100_000;
/// A hundred years: "forever" without overflowing a time.
const MAX_KEEP_DAYS: u32 = 36_500;

fn check_keep_sessions(n: i64) -> Result<u32, Refusal> {
    match u32::try_from(n) {
        Ok(keep) if keep <= MAX_KEEP_SESSIONS => Ok(keep),
        _ => Err(Refusal::new(format!("is out of range: give 0 to {MAX_KEEP_SESSIONS}"), None)),
    }
}

fn check_keep_days(n: i64) -> Result<u32, Refusal> {
    match u32::try_from(n) {
        Ok(days) if days <= MAX_KEEP_DAYS => Ok(days),
        _ => Err(Refusal::new(format!("is out of range: give 0 to {MAX_KEEP_DAYS} days"), None)),
    }
}

fn check_memory(text: &str) -> Result<Size, Refusal> {
    check_size(text, MIN_MEMORY, "is too small: the guest needs at least 128M", "\"512M\"")
}

fn check_disk(text: &str) -> Result<Size, Refusal> {
    check_size(text, MIN_DISK, "is too small: give at least 64M", "\"1G\"")
}

fn check_size(text: &str, min: u64, too_small: &str, example: &'static str) -> Result<Size, Refusal> {
    let bytes = parse_size(text).map_err(|why| Refusal::new(why, Some(example)))?;
    if bytes < min {
        return Err(Refusal::new(too_small, Some(example)));
    }
    Ok(Size { text: text.trim().to_string(), bytes })
}

/// A value-enum setting by its name as on the command line.
fn choice<T: clap::ValueEnum>(text: &str, allowed: &str) -> Result<T, Refusal> {
    T::from_str(text, false).map_err(|_| Refusal::new(format!("is not one of {allowed}"), None))
}

/// The name a value-enum value has on the command line and in the file.
fn value_name<T: clap::ValueEnum>(value: T) -> String {
    value.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
}

/// Parses sizes like 512M, 2G, 1.5G, 2GiB or a plain number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| "is not a size: use a number with a unit".to_string())?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => return Err(format!("has the unknown unit {other:?}: use K, M, G or T")),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err("is out of range".to_string());
    }
    // In range (checked above); a fraction of a byte is dropped on purpose.
    #[allow(clippy::cast_possible_truncation)]
    let bytes = bytes as u64;
    Ok(bytes)
}

/// Whether we may look up names in the directory holding `path`.
fn parent_searchable(path: &std::path::Path) -> bool {
    path.parent().is_some_and(|dir| nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, SettingsError> {
        Settings::parse(text, PathBuf::from("/home/u/.config/stockade/config.toml"))
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("2X").is_err());
    }

    #[test]
    fn an_empty_file_is_all_defaults() {
        let s = parse("").unwrap();
        assert!(s.exists);
        assert_eq!((s.cpus.value, s.memory.value.bytes, s.disk.value.bytes), (2, 2 << 30, 8 << 30));
        assert_eq!(s.apply.value, ApplyMode::Ask);
        assert!(s.policy.value.is_empty());
        assert!(s.entries().iter().all(|(_, _, source)| *source == Source::Default));
    }

    #[test]
    fn reads_every_key_with_its_line() {
        let s = parse(
            "# mine\npolicy = [\"npm\", \"./p.toml\"]\ncpus = 4\nmemory = \"4G\"\ndisk = \"16G\"\napply = \"none\"\ncolor = \"never\"\n",
        )
        .unwrap();
        assert_eq!(s.policy.value, ["npm", "./p.toml"]);
        assert_eq!(s.policy.source, Source::File { line: 2 });
        assert_eq!(s.cpus, Setting { value: 4, source: Source::File { line: 3 } });
        assert_eq!(s.memory.value, Size { text: "4G".into(), bytes: 4 << 30 });
        assert_eq!(s.disk.value.bytes, 16 << 30);
        assert_eq!(s.apply.value, ApplyMode::None);
        assert_eq!(s.color.value, ColorChoice::Never);
        assert_eq!(s.color.source, Source::File { line: 7 });
    }

    #[test]
    fn runs_code_takes_patterns_and_refuses_negations() {
        let s = parse("runs_code = [\"tools/*.sh\", \".githooks/\"]\n").unwrap();
        assert_eq!(s.runs_code.value, ["tools/*.sh", ".githooks/"]);
        assert_eq!(s.runs_code.source, Source::File { line: 1 });
        let err = error("runs_code = [\"!.envrc\"]\n");
        assert!(err.contains(":1:13: runs_code:") && err.contains("nothing can be un-flagged"), "{err}");
        let err = error("runs_code = \"tools/*.sh\"\n");
        assert!(err.contains("give a list of patterns"), "{err}");
        let err = error("runs_code = [1]\n");
        assert!(err.contains("must list patterns as strings"), "{err}");
    }

    #[test]
    fn unknown_keys_name_the_file_line_and_the_known_keys() {
        let err = error("cpus = 2\ncpu = 4\n");
        assert!(err.starts_with("/home/u/.config/stockade/config.toml:2:1: unknown setting `cpu`"), "{err}");
        assert!(err.contains("policy, cpus, memory, disk, apply, color") && err.contains("remove it"), "{err}");
        let err = error("[run]\ncpus = 2\n");
        assert!(err.contains(":1:2: unknown setting `run`"), "{err}");
    }

    #[test]
    fn bad_values_name_the_line_the_key_and_a_fix() {
        let err = error("\n\nmemory = \"1K\"\n");
        assert!(
            err.ends_with(
                ":3:10: memory = \"1K\" is too small: the guest needs at least 128M (e.g. memory = \"512M\")"
            ),
            "{err}"
        );
        let err = error("cpus = 99\n");
        assert!(err.ends_with(":1:8: cpus = 99 is out of range: give 1 to 32"), "{err}");
        let err = error("cpus = \"4\"\n");
        assert!(err.contains("cpus = \"4\" has the wrong type: give a number, e.g. cpus = 4"), "{err}");
        let err = error("apply = \"always\"\n");
        assert!(err.contains("apply = \"always\" is not one of ask, all or none"), "{err}");
        let err = error("policy = \"npm\"\n");
        assert!(err.contains("must be a list, even of one: write policy = [\"npm\"]"), "{err}");
        let err = error("disk = \"2X\"\n");
        assert!(
            err.contains("disk = \"2X\" has the unknown unit \"X\": use K, M, G or T (e.g. disk = \"1G\")"),
            "{err}"
        );
        let err = error("cpus = \n");
        assert!(
            err.starts_with("/home/u/.config/stockade/config.toml:1:") && err.contains("fix the TOML syntax"),
            "{err}"
        );
    }

    #[test]
    fn flags_override_the_file_and_are_checked_as_flags() {
        let file = parse("cpus = 4\nmemory = \"4G\"\npolicy = [\"npm\"]\n").unwrap();
        let policy = vec!["cargo".to_string()];
        let s = file
            .clone()
            .with_flags(Flags { cpus: Some(8), policy: &policy, color: Some(ColorChoice::Always), ..Flags::default() })
            .unwrap();
        assert_eq!(s.cpus, Setting { value: 8, source: Source::Flag("--cpus") });
        assert_eq!(s.policy.value, ["cargo"]);
        assert_eq!(s.memory.source, Source::File { line: 2 }, "what no flag names stays the file's");
        assert_eq!(s.color.value, ColorChoice::Always);
        let err = file.clone().with_flags(Flags { memory: Some("0"), ..Flags::default() }).unwrap_err();
        assert_eq!(err.to_string(), "--memory 0 is too small: the guest needs at least 128M (e.g. --memory 512M)");
        let err = file.with_flags(Flags { cpus: Some(0), ..Flags::default() }).unwrap_err();
        assert_eq!(err.to_string(), "--cpus 0 is out of range: give 1 to 32");
    }

    #[test]
    fn reads_the_session_retention() {
        let s = parse("keep_sessions = 20\nkeep_days = 3\n").unwrap();
        assert_eq!(s.keep_sessions, Setting { value: 20, source: Source::File { line: 1 } });
        assert_eq!(s.retention(), Retention::new(20, 3));
        assert_eq!(parse("").unwrap().retention(), Retention::new(100, 14));
        let err = error("keep_days = -1\n");
        assert!(err.ends_with(":1:13: keep_days = -1 is out of range: give 0 to 36500 days"), "{err}");
        let err = error("keep_sessions = \"10\"\n");
        assert!(err.contains("has the wrong type: give a number, e.g. keep_sessions = 100"), "{err}");
    }

    /// Every refusal, word for word: the texts users meet.
    #[test]
    fn every_refusal_word_for_word() {
        let file = [
            (
                "policy = 1",
                "1:10: policy = 1 has the wrong type: give a list of policy names or paths, e.g. policy = [\"npm\"]",
            ),
            ("policy = \"npm\"", "1:10: policy = \"npm\" must be a list, even of one: write policy = [\"npm\"]"),
            (
                "policy = [\"npm\", 1]",
                "1:10: policy = [\"npm\", 1] must list policy names or paths as strings (e.g. policy = [\"npm\", \"github\"])",
            ),
            (
                "policy = [\" \"]",
                "1:10: policy = [\" \"] must list policy names or paths as strings (e.g. policy = [\"npm\", \"github\"])",
            ),
            ("cpus = \"4\"", "1:8: cpus = \"4\" has the wrong type: give a number, e.g. cpus = 4"),
            ("cpus = 0", "1:8: cpus = 0 is out of range: give 1 to 32"),
            ("memory = 4", "1:10: memory = 4 has the wrong type: give a size in quotes, e.g. memory = \"4G\""),
            (
                "memory = \"1K\"",
                "1:10: memory = \"1K\" is too small: the guest needs at least 128M (e.g. memory = \"512M\")",
            ),
            (
                "memory = \"lots\"",
                "1:10: memory = \"lots\" is not a size: use a number with a unit (e.g. memory = \"512M\")",
            ),
            ("disk = true", "1:8: disk = true has the wrong type: give a size in quotes, e.g. disk = \"16G\""),
            ("disk = \"2X\"", "1:8: disk = \"2X\" has the unknown unit \"X\": use K, M, G or T (e.g. disk = \"1G\")"),
            ("apply = 1", "1:9: apply = 1 has the wrong type: give \"ask\", \"all\" or \"none\""),
            ("apply = \"always\"", "1:9: apply = \"always\" is not one of ask, all or none"),
            ("color = 1", "1:9: color = 1 has the wrong type: give \"auto\", \"always\" or \"never\""),
            ("color = \"ask\"", "1:9: color = \"ask\" is not one of auto, always or never"),
            (
                "home_tools = \"no\"",
                "1:14: home_tools = \"no\" has the wrong type: give true or false, e.g. home_tools = false",
            ),
            (
                "keep_sessions = \"1\"",
                "1:17: keep_sessions = \"1\" has the wrong type: give a number, e.g. keep_sessions = 100",
            ),
            ("keep_sessions = 100001", "1:17: keep_sessions = 100001 is out of range: give 0 to 100000"),
            ("keep_days = 1.5", "1:13: keep_days = 1.5 has the wrong type: give a number of days, e.g. keep_days = 14"),
            ("keep_days = 36501", "1:13: keep_days = 36501 is out of range: give 0 to 36500 days"),
            (
                "runs_code = \"x\"",
                "1:13: runs_code = \"x\" has the wrong type: give a list of patterns, e.g. runs_code = [\"tools/*.sh\"]",
            ),
            (
                "runs_code = [1]",
                "1:13: runs_code = [1] must list patterns as strings (e.g. runs_code = [\"tools/*.sh\"])",
            ),
            ("runs_code = [\"\"]", "1:13: runs_code: an empty pattern would match nothing"),
            (
                "package_cache = 5",
                "1:17: package_cache = 5 has the wrong type: give a size in quotes, e.g. package_cache = \"5G\" (\"0\" turns the cache off)",
            ),
            (
                "package_cache = \"lots\"",
                "1:17: package_cache = \"lots\" is not a size: use a number with a unit (e.g. package_cache = \"5G\")",
            ),
            (
                "timeout = \"30s\"",
                "1:1: unknown setting `timeout`: the settings are policy, cpus, memory, disk, apply, color, home_tools, keep_sessions, keep_days, runs_code, package_cache, agent_state; remove it or correct its name",
            ),
            ("cpus = ", "1:8: string values must be quoted, expected literal string; fix the TOML syntax"),
        ];
        for (text, message) in file {
            assert_eq!(error(text), format!("/home/u/.config/stockade/config.toml:{message}"), "{text}");
        }
        let flags = [
            (Flags { cpus: Some(0), ..Flags::default() }, "--cpus 0 is out of range: give 1 to 32"),
            (Flags { cpus: Some(33), ..Flags::default() }, "--cpus 33 is out of range: give 1 to 32"),
            (
                Flags { memory: Some("0"), ..Flags::default() },
                "--memory 0 is too small: the guest needs at least 128M (e.g. --memory 512M)",
            ),
            (
                Flags { memory: Some("lots"), ..Flags::default() },
                "--memory lots is not a size: use a number with a unit (e.g. --memory 512M)",
            ),
            (
                Flags { disk: Some("1M"), ..Flags::default() },
                "--disk 1M is too small: give at least 64M (e.g. --disk 1G)",
            ),
            (
                Flags { disk: Some("2X"), ..Flags::default() },
                "--disk 2X has the unknown unit \"X\": use K, M, G or T (e.g. --disk 1G)",
            ),
        ];
        for (flags, message) in flags {
            assert_eq!(Settings::defaults(PathBuf::new()).with_flags(flags).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn each_flag_sets_its_setting_and_is_named_as_its_source() {
        // A blank --policy name is not refused here: the policy loader
        // refuses it and lists the names there are.
        let policy = vec![String::new()];
        let flags = Flags {
            policy: &policy,
            cpus: Some(3),
            memory: Some(" 1G"),
            disk: Some("2G"),
            apply: Some(ApplyMode::All),
            color: Some(ColorChoice::Never),
            no_home_tools: true,
        };
        let s = parse("cpus = 4\nkeep_days = 3\n").unwrap().with_flags(flags).unwrap();
        let shown: Vec<String> =
            s.entries().iter().map(|(key, value, source)| format!("{key} = {value} # {source}")).collect();
        assert_eq!(
            shown,
            [
                "policy = [\"\"] # --policy",
                "cpus = 3 # --cpus",
                "memory = \"1G\" # --memory",
                "disk = \"2G\" # --disk",
                "apply = \"all\" # --apply",
                "color = \"never\" # --color",
                "home_tools = false # --no-home-tools",
                "keep_sessions = 100 # default",
                "keep_days = 3 # config file, line 2",
                "runs_code = [] # default",
                "package_cache = \"5G\" # default",
                "agent_state = \"4G\" # default",
            ]
        );
        assert_eq!(s.memory.value.bytes, 1 << 30);
    }

    /// The arguments of `run` or `shell` as the whole command line builds
    /// them (the one parsing, help, the manual and completions use).
    fn arguments_of(subcommand: &str) -> Vec<clap::Arg> {
        let mut command = crate::cli::command();
        command.build();
        let sub = command.find_subcommand(subcommand).unwrap_or_else(|| panic!("no subcommand {subcommand}"));
        sub.get_arguments().cloned().collect()
    }

    #[test]
    fn each_flag_a_definition_names_is_a_flag_of_run_and_shell() {
        for subcommand in ["run", "shell"] {
            let longs: Vec<String> =
                arguments_of(subcommand).iter().filter_map(|a| a.get_long().map(|l| format!("--{l}"))).collect();
            for flag in DEFINITIONS.iter().filter_map(|d| d.flag.as_ref()) {
                assert!(longs.contains(&flag.name.to_string()), "`stockade {subcommand}` has no {}", flag.name);
            }
        }
    }

    #[test]
    fn the_help_of_each_flag_shows_the_default_the_settings_hold() {
        let defaults = Settings::defaults(PathBuf::new());
        let expected: Vec<(String, String)> = DEFINITIONS
            .iter()
            .filter_map(|d| {
                let flag = d.flag.as_ref().filter(|flag| flag.shows_default)?;
                Some((flag.name.to_string(), (d.show)(&defaults).0.trim_matches('"').to_string()))
            })
            .collect();
        assert_eq!(
            expected,
            [("--cpus", "2"), ("--memory", "2G"), ("--disk", "8G"), ("--apply", "ask")]
                .map(|(f, v)| (f.into(), v.into()))
        );
        for subcommand in ["run", "shell"] {
            // Each argument's "[default: X]", once in its help and the same
            // in its long help, if it has one.
            let mut shown: Vec<(String, String)> = Vec::new();
            for arg in arguments_of(subcommand) {
                let flag = format!("--{}", arg.get_long().unwrap_or_default());
                let mut values = Vec::new();
                for text in [arg.get_help(), arg.get_long_help()].into_iter().flatten().map(|h| h.to_string()) {
                    let found: Vec<&str> = text
                        .split("[default: ")
                        .skip(1)
                        .map(|rest| rest.split(']').next().unwrap_or_default())
                        .collect();
                    assert!(found.len() <= 1, "{flag} shows a default more than once: {text}");
                    values.extend(found.into_iter().map(str::to_string));
                }
                values.dedup();
                assert!(values.len() <= 1, "{flag}'s help and long help show different defaults: {values:?}");
                shown.extend(values.into_iter().map(|value| (flag.clone(), value)));
            }
            assert_eq!(shown, expected, "the defaults in the help of `stockade {subcommand}`");
        }
    }

    #[test]
    fn a_missing_file_is_all_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::load_from(dir.path().join(FILE_NAME)).unwrap();
        assert!(!s.exists);
        assert_eq!(s, Settings::defaults(dir.path().join(FILE_NAME)));
    }
}

//! Stage 1, prepare: the host check, the session and its record, and what
//! the VM and the guest are given (scratch disk, the init's listeners, the
//! agents' state, the root layout's shares), all before the VMM starts.
//!
//! The egress proxy starts first, on a thread of its own, and is waited for
//! only after the VMM has started (in [`complete`], called by the boot
//! stage): starting it can take a while (credential commands, the CA, the
//! host's trust store), and nothing the VMM needs comes from it. The shares
//! are fixed here; what comes from the proxy (the CA files, resolv.conf, the
//! profile, the sign-in files, the proxy variables) reaches the guest with
//! the command, which it asks for only once it has booted.

use crate::proxy::packages::CacheConfig;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::changes;
use crate::host::kernel;
use crate::host::kvm::{self, DeviceAccess, KvmKind};
use crate::paths::Dirs;
use crate::policy::MountMode;
use crate::protocol::auth::Token;
use crate::protocol::{CHANGES_PORT, CONTROL_PORT, PUBLISH_PORT, STDIN_PORT};
use crate::session;
use crate::supervisor::RunConfig;
use crate::supervisor::channels::network::{Egress, GuestSide};
use crate::supervisor::channels::{admission, publish, staging};
use crate::supervisor::guest_view::{agent_state, home_tools, root, scratch};
use crate::supervisor::vm;

/// The host and the invocation, checked before anything is created.
pub struct Host {
    pub dirs: Dirs,
    pub kernel: PathBuf,
    pub cwd: PathBuf,
    pub user: root::User,
    pub workspace: PathBuf,
    /// The root image in image mode.
    pub image: Option<PathBuf>,
    pub system: root::System,
}

impl Host {
    pub fn check(config: &RunConfig) -> anyhow::Result<Host> {
        let dirs = Dirs::resolve()?;
        let kernel = check_kvm(&dirs, config.kernel.as_deref())?;
        crate::supervisor::reached("KVM checked");
        if config.jail {
            if let Err(why) = crate::jail::check_available() {
                bail!(
                    "the VMM cannot be jailed on this host: {why}. Fix that, or run with --no-jail \
                     (the VM boundary stays; a VMM bug would no longer be contained)"
                );
            }
        }
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let user = root::User::current();
        let workspace = root::find_workspace(&cwd, &user.home)?;
        crate::supervisor::reached("workspace found");
        let image = config.image.as_deref().map(|name| crate::image::find(&dirs.cache, name)).transpose()?;
        let system = if image.is_some() { root::System::Image } else { root::System::Host };
        Ok(Host { dirs, kernel, cwd, user, workspace, image: image.map(|i| i.path), system })
    }
}

/// Refuses early, with the fix, when this host cannot run the VM.
pub(in crate::supervisor) fn check_kvm(dirs: &Dirs, explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match kvm::check_device() {
        DeviceAccess::Usable => {}
        DeviceAccess::Missing => bail!(
            "/dev/kvm does not exist: this host has no KVM. Enable virtualization (VT-x/AMD-V) and load kvm_intel or kvm_amd; `stockade doctor` checks the rest"
        ),
        DeviceAccess::PermissionDenied => {
            bail!("you cannot open /dev/kvm: {}; `stockade doctor` checks the rest", kvm::permission_fix())
        }
        DeviceAccess::Failed(e) => bail!("cannot open /dev/kvm: {e}; see `stockade doctor`"),
    }
    let kernel = kernel::locate(dirs, explicit)?;
    if kvm::detect_kind() == KvmKind::Pvm && kernel.pvm_guest != Some(true) {
        bail!(
            "this host's KVM is PVM (kvm_pvm), where a standard guest kernel cannot boot, and {} is not a PVM guest kernel. \
             Run stockade on a host with hardware virtualization, or use a guest kernel built with CONFIG_PVM_GUEST=y; \
             `stockade doctor` explains",
            kernel.path.display()
        );
    }
    Ok(kernel.path)
}

/// The session directory, its run record (written at once, so that a run
/// that dies still shows in `stockade sessions`) and its change store.
pub struct Recorded {
    pub session: session::Session,
    pub record: session::RunRecord,
    pub store: changes::Store,
}

impl Recorded {
    fn create(config: &RunConfig, host: &Host) -> anyhow::Result<Recorded> {
        let session = session::Session::create(&host.dirs.data)?;
        let record = session::RunRecord {
            id: session.id.clone(),
            command: config.argv.clone(),
            workspace: host.workspace.display().to_string(),
            started: session::timestamp(session.started),
            duration_ms: None,
            status: None,
            outcome: None,
            agent_settings: None,
            git_head: changes::git::head_of(&host.workspace),
        };
        session.write_record(&record)?;
        let store = changes::Store::open(&session.dir)?;
        Ok(Recorded { session, record, store })
    }

    /// Where the VMM's vsock broker finds our listeners, `<base>_<port>`.
    pub fn vsock_base(&self) -> PathBuf {
        self.session.dir.join("v.sock")
    }
}

/// The scratch disk. Removed when dropped: once the guest's changes are
/// staged (or the run failed before the guest wrote any) it holds nothing
/// we need, unless [`Scratch::keep`] says otherwise.
pub struct Scratch {
    path: PathBuf,
    kept: bool,
}

impl Scratch {
    fn create(session: &session::Session, bytes: u64, cache: &Path) -> anyhow::Result<(Scratch, scratch::Formatting)> {
        let path = session.scratch_disk();
        let formatting = scratch::create(&path, bytes, &scratch::blanks_dir(cache))?;
        Ok((Scratch { path, kept: false }, formatting))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The guest's changes were not staged: the disk is all that holds
    /// them now.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Listener socket files in the session directory, removed when dropped.
pub struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The listeners of the init's ports, and what connections on them need.
pub struct Channels {
    pub control: UnixListener,
    pub stdin: UnixListener,
    /// Stages the init's change set as it streams in.
    pub receiver: staging::Receiver,
    /// This boot's secret: only the init, which gets it in the command, has it.
    pub token: Token,
    pub tampering: admission::Tampering,
    /// The published ports' host listeners, and where the init dials back.
    pub publish: Option<(publish::Bound, UnixListener)>,
}

impl Channels {
    pub(in crate::supervisor) fn open(
        vsock_base: &Path,
        store: &changes::Store,
        published: Option<publish::Bound>,
    ) -> anyhow::Result<(Channels, SocketFiles)> {
        let mut sockets = SocketFiles(Vec::new());
        let (control, path) = vm::listen(vsock_base, CONTROL_PORT)?;
        sockets.0.push(path);
        let (stdin, path) = vm::listen(vsock_base, STDIN_PORT)?;
        sockets.0.push(path);
        // The receiver removes its own socket.
        let (changes, changes_path) = vm::listen(vsock_base, CHANGES_PORT)?;
        let token = Token::generate().context("cannot draw this run's token from /dev/urandom")?;
        let tampering = admission::Tampering::default();
        let receiver = staging::receive(changes, changes_path, store, token.clone(), tampering.clone())?;
        let publish = match published {
            Some(bound) => {
                let (callbacks, path) = vm::listen(vsock_base, PUBLISH_PORT)?;
                sockets.0.push(path);
                Some((bound, callbacks))
            }
            None => None,
        };
        Ok((Channels { control, stdin, receiver, token, tampering, publish }, sockets))
    }
}

/// What stays set up until the run finishes: `finish` takes it down in its
/// order, Drop on the way out of a failure.
pub struct Held {
    /// Up once [`complete`] has waited for it.
    pub network: Egress,
    pub sockets: SocketFiles,
    pub scratch: Scratch,
    pub agents: Vec<agent_state::Prepared>,
    /// What the guest did on the init's channels that the init never does.
    pub tampering: admission::Tampering,
    /// What the published ports' clients found, for the end of the run.
    pub published: publish::Seen,
}

/// What the VM and the guest are given, used up as the VMM starts and the
/// command is sent.
pub struct GuestStart {
    /// Its shares are all the VMM needs; the files made from the network
    /// are added once the proxy is up.
    pub layout: root::Layout,
    pub channels: Channels,
    /// The guest mounts the scratch disk only after the command is sent.
    pub formatting: scratch::Formatting,
}

pub struct Prepared {
    pub recorded: Recorded,
    pub held: Held,
    pub guest: GuestStart,
}

impl Prepared {
    pub fn new(config: &RunConfig, host: &Host) -> anyhow::Result<Prepared> {
        // First: a host port another program holds fails the run before
        // anything is created.
        let published = publish::bind(&config.publish)?;
        let recorded = Recorded::create(config, host)?;
        crate::supervisor::reached("session created");
        let seen = recorded.store.start_seen()?;
        let package_cache = (config.package_cache_bytes > 0)
            .then(|| CacheConfig { dir: host.dirs.packages(), limit: config.package_cache_bytes });
        let network = Egress::start(
            &config.policy,
            &host.dirs.data,
            package_cache,
            &recorded.session.dir,
            &recorded.vsock_base(),
        )?;
        let (scratch, formatting) = Scratch::create(&recorded.session, config.disk_bytes, &host.dirs.cache)?;
        crate::supervisor::reached("egress proxy and scratch disk started");
        let published_seen = published.seen.clone();
        let published = (!published.is_empty()).then_some(published);
        let (channels, sockets) = Channels::open(&recorded.vsock_base(), &recorded.store, published)?;
        let mut agents = Vec::new();
        for agent in &config.policy.agents {
            let state = agent_state::prepare(agent, &host.user.home, &host.dirs.data)
                .with_context(|| format!("cannot ready the state of agent {}", agent.name))?;
            tracing::info!("agent {} keeps its state in {}", agent.name, state.home.display());
            agents.push(state);
        }
        let layout = lay_out(config, host, seen, &agents)?;
        crate::supervisor::reached("root laid out");
        let tampering = channels.tampering.clone();
        Ok(Prepared {
            recorded,
            held: Held { network, sockets, scratch, agents, tampering, published: published_seen },
            guest: GuestStart { layout, channels, formatting },
        })
    }
}

/// The root layout with every share in it: the policy's mounts, the home
/// toolchains, the agents' state.
fn lay_out(
    config: &RunConfig,
    host: &Host,
    seen: PathBuf,
    agents: &[agent_state::Prepared],
) -> anyhow::Result<root::Layout> {
    let user = &host.user;
    let mut layout = root::layout(&host.workspace, user, host.system)?;
    let root::Layout { shares, root, .. } = &mut layout;
    for skipped in root::policy_mounts(&config.policy.mounts, &user.home, shares, root) {
        eprintln!("stockade: warning: policy mount {skipped} was not mounted; the guest does not see it");
    }
    let tools = home_tools(config, host);
    for dir in &tools.dirs {
        tracing::info!("home toolchain shared read-only: {} ({})", dir.path.display(), dir.why);
    }
    root::home_tool_shares(&tools, shares, root);
    root::record_sightings(shares, seen);
    for state in agents {
        state.attach(&user.home, (user.uid, user.gid), config.agent_state_bytes, shares, root);
    }
    Ok(layout)
}

/// What the command gets once the proxy is up.
pub struct Completed {
    pub env: Vec<(String, String)>,
    /// The init serves the host's ssh-agent relay.
    pub ssh_agent: bool,
}

/// The command's root layout and environment, once the proxy is up: the
/// files made from the network, the sign-in files (in an agent's state
/// when one holds them, else generated in place), and the guest's
/// known_hosts when the policy allows SSH.
pub fn complete(
    layout: &mut root::Layout,
    config: &RunConfig,
    host: &Host,
    held: &mut Held,
) -> anyhow::Result<Completed> {
    let user = &host.user;
    let net = held.network.ready()?;
    let trust = layout.complete(user, &net)?;
    if let Some(known_hosts) = &net.known_hosts {
        root::place_signin_file(KNOWN_HOSTS, known_hosts.as_bytes(), &user.home, &mut layout.root);
    }
    let ssh_agent = net.ssh_agent;
    for file in &net.signin_files {
        let rel = Path::new(file.file.trim_start_matches("~/"));
        match held.agents.iter().find(|a| file.file.starts_with("~/") && a.holds(rel)) {
            Some(state) => state.place(rel, &file.content)?,
            None => root::place_signin_file(&file.file, &file.content, &user.home, &mut layout.root),
        }
    }
    Ok(Completed { env: guest_env(&config.env, net, trust), ssh_agent })
}

/// The guest's known_hosts: its home holds none of the host's files.
const KNOWN_HOSTS: &str = "~/.ssh/known_hosts";

/// The home toolchains to share (host mode with `home_tools` only): those
/// on the command's PATH, less what is shared anyway, and never reached
/// through what the repository or a guest writes.
fn home_tools(config: &RunConfig, host: &Host) -> home_tools::HomeTools {
    if !config.home_tools || host.system != root::System::Host {
        return home_tools::HomeTools::default();
    }
    let guest_path = config.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or_default();
    let home = &host.user.home;
    let mounts = &config.policy.mounts;
    let mut shared = vec![host.workspace.clone()];
    shared.extend(mounts.iter().map(|m| m.host_path(home)));
    let mut untrusted = vec![host.workspace.clone(), host.dirs.data.clone(), host.dirs.cache.clone()];
    untrusted.extend(mounts.iter().filter(|m| m.mode == MountMode::Rw).map(|m| m.host_path(home)));
    let bounds = home_tools::Bounds { shared, untrusted };
    home_tools::discover(guest_path, home, &bounds, |name| std::env::var(name).ok())
}

/// The command's environment: the user's, then over it the proxy
/// variables, the CA variables, and last the credential placeholders (a
/// secret must never reach the guest under a name a credential rule covers).
fn guest_env(user: &[(String, String)], net: GuestSide, trust: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = user.to_vec();
    for (name, value) in net.env.into_iter().chain(trust).chain(net.placeholders) {
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The proxy's and the CA's variables win over the user's, and the
    /// credential placeholders over everything: a secret the user exported
    /// under a credential's name never reaches the guest.
    #[test]
    fn placeholders_win_over_everything_and_the_proxy_over_the_user() {
        let user = vars(&[("HTTP_PROXY", "http://mine"), ("API_KEY", "secret"), ("KEEP", "1")]);
        let net = GuestSide {
            env: vars(&[("HTTP_PROXY", "http://127.0.0.1:3128")]),
            placeholders: vars(&[("API_KEY", "placeholder")]),
            trust: None,
            signin_files: Vec::new(),
            known_hosts: None,
            ssh_agent: false,
        };
        let env = guest_env(&user, net, vars(&[("SSL_CERT_FILE", "/ca.pem"), ("API_KEY", "ca-side")]));
        assert_eq!(
            env,
            vars(&[
                ("KEEP", "1"),
                ("HTTP_PROXY", "http://127.0.0.1:3128"),
                ("SSL_CERT_FILE", "/ca.pem"),
                ("API_KEY", "placeholder"),
            ])
        );
    }

    #[test]
    fn the_scratch_disk_goes_unless_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let (spent, kept) = (tmp.path().join("spent.img"), tmp.path().join("kept.img"));
        for path in [&spent, &kept] {
            std::fs::write(path, b"").unwrap();
        }
        drop(Scratch { path: spent.clone(), kept: false });
        Scratch { path: kept.clone(), kept: false }.keep();
        assert!(!spent.exists(), "a spent disk is removed");
        assert!(kept.exists(), "a disk holding unstaged changes stays");
    }
}

//! Stage 2, boot: describes the VM, starts the VMM process, and writes the
//! command the guest gets once it calls in. The command is built while the
//! guest boots (the init asks for it only after its `Ready`): it waits for
//! the egress proxy, which has been starting since the prepare stage.

use anyhow::Context;

use super::prepare::{self, Channels, GuestStart, Held, Host, Recorded};
use super::terminal;
use crate::host::templates;
use crate::protocol::auth::Token;
use crate::protocol::vm_config::VmConfig;
use crate::protocol::{RunSpec, WindowSize};
use crate::session;
use crate::supervisor::RunConfig;
use crate::supervisor::channels::admission;
use crate::supervisor::guest_view::scratch;
use crate::supervisor::vm;

/// The command for the guest, and what must be done before it is sent.
pub struct Command {
    pub spec: RunSpec,
    /// The guest mounts the scratch disk as soon as it has the command.
    pub formatting: scratch::Formatting,
}

/// The running VMM (killed if dropped), and what the conversation with its
/// guest uses up.
pub struct Booted {
    pub vmm: vm::VmProcess,
    pub command: Command,
    pub channels: Channels,
}

impl Booted {
    pub fn start(
        config: &RunConfig,
        host: &Host,
        recorded: &Recorded,
        held: &mut Held,
        guest: GuestStart,
    ) -> anyhow::Result<Booted> {
        let GuestStart { mut layout, channels, formatting } = guest;
        let session = &recorded.session;
        let mut vm_config = VmConfig {
            shares: std::mem::take(&mut layout.shares),
            secrets: std::mem::take(&mut layout.secrets),
            ..vm_config(config, host, session)?
        };
        let template = if config.snapshot { template(&mut vm_config, &host.dirs)? } else { None };
        let refusals = channels.tampering.clone();
        let on_refused = move |host, guest| {
            refusals.report(admission::refused_by_the_vmm(host));
            tracing::debug!("the VMM refused host port {host} to guest port {guest}");
        };
        let vmm = vm::VmProcess::start(
            &vm_config,
            vm::Paths { session: &session.dir, log: &session.vmm_log(), vsock_base: &recorded.vsock_base() },
            template,
            on_refused,
        )?;
        tracing::info!("session {} in {}", session.id, session.dir.display());
        crate::supervisor::reached("VMM started");
        let completed = prepare::complete(&mut layout, config, host, held)?;
        crate::supervisor::reached("egress proxy up");
        let spec = RunSpec {
            root: layout.root,
            env: completed.env,
            ssh_agent: completed.ssh_agent,
            ..run_spec(config, host, channels.token.clone())?
        };
        Ok(Booted { vmm, command: Command { spec, formatting }, channels })
    }
}

/// Picks the template for `vm` and tells the VMM about it. A resumed VM
/// has no boot log, so the kernel's command line does not depend on `-v`
/// (which would make a template of its own).
fn template(vm: &mut VmConfig, dirs: &crate::paths::Dirs) -> anyhow::Result<Option<templates::Use>> {
    vm.verbose_kernel = false;
    let root = templates::root(&dirs.cache);
    let key = templates::key(vm).context("cannot read the guest kernel or the stockade binary")?;
    let chosen = match templates::choose(&root, &key) {
        Ok(chosen) => chosen,
        Err(e) => {
            // No template costs time, not the run.
            tracing::warn!("cannot use the templates in {}: {e}", root.display());
            return Ok(None);
        }
    };
    vm.template = Some(chosen.plan.clone());
    Ok(Some(chosen))
}

/// The VM, less its shares.
fn vm_config(config: &RunConfig, host: &Host, session: &session::Session) -> anyhow::Result<VmConfig> {
    Ok(VmConfig {
        kernel: host.kernel.clone(),
        init: std::env::current_exe().context("cannot find the stockade binary")?,
        vcpus: config.cpus,
        memory_bytes: config.memory_bytes,
        kernel_log: session.kernel_log(),
        vsock_broker: session.dir.join("broker.sock"),
        shares: Vec::new(),
        secrets: Vec::new(),
        network: true,
        disk: Some(session.scratch_disk()),
        image: host.image.clone(),
        jail: config.jail,
        verbose_kernel: config.verbose_kernel,
        kernel_args: config.kernel_args.clone(),
        template: None,
    })
}

/// The command, less its root and environment.
fn run_spec(config: &RunConfig, host: &Host, token: Token) -> anyhow::Result<RunSpec> {
    Ok(RunSpec {
        argv: config.argv.clone(),
        env: Vec::new(),
        cwd: host.cwd.to_str().context("the current directory is not valid UTF-8")?.to_string(),
        uid: host.user.uid,
        gid: host.user.gid,
        root: Vec::new(),
        tty: config
            .tty
            .unwrap_or_else(terminal::interactive)
            .then(|| terminal::size().unwrap_or(WindowSize { rows: 24, cols: 80 })),
        network: true,
        pids: config.pids,
        docker: config.docker,
        ssh_agent: false,
        token,
        clock: None,
        seed: Vec::new(),
        recover: false,
    })
}

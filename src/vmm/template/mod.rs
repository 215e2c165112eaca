//! Templates: a VM saved at the init's template point (see
//! `protocol::template`), so that later runs of the same shape resume it
//! instead of booting a kernel.
//!
//! A template is a directory of two files: `memory`, the guest's RAM with
//! only touched pages written (`pages`), and `state`, everything KVM and our
//! devices hold (`cpu`, `machine`, the transports and the UART, and what a
//! device keeps of its own through its `save_state` and `restore_state`
//! hooks, see `devices::virtio::persist`), sealed with its digest. The
//! supervisor picks the directory by a key over everything that shapes the
//! guest up to that point (kernel, binary, vCPUs, memory, devices, and
//! `MAGIC`, the format's version); the VMM checks here what only it can
//! see: the CPUID each vCPU is given and the TSC frequency. Anything that
//! does not match or does not load makes the run boot instead
//! (`Start::BootedInstead`).
//!
//! `Recorder` saves one; `Template::open` reads one back.

pub mod cpu;
pub mod machine;
pub mod pages;
pub mod pause;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VmFd};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use super::devices::mmio::{MmioTransport, TransportState};
use super::devices::serial::UartState;
use super::devices::virtio::persist::DeviceState;
use super::devices::virtio::worker;
use crate::protocol::broker::StartKind;
use cpu::VcpuState;
use machine::MachineState;
use pause::Pause;

pub const MEMORY_FILE: &str = "memory";
pub const STATE_FILE: &str = "state";
/// The template format's one version: the first word of every state file,
/// and a part of the supervisor's template key (`host::templates::key`). A
/// new layout of the state or a new meaning of what a template holds gets a
/// new number, so an old template is never misread, nor picked.
pub const MAGIC: &str = "stockade-template-3";
/// How long the other vCPUs and the device workers get to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum TemplateError {
    #[error("KVM could not {step}")]
    Kvm {
        step: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot write the template")]
    Write(#[source] std::io::Error),
    #[error("cannot read the template")]
    Read(#[source] std::io::Error),
    #[error("the template is damaged: {0}")]
    Damaged(String),
    #[error("the template was made on another CPU or KVM: {0}")]
    Mismatch(String),
    #[error("{0}")]
    Refused(String),
}

impl TemplateError {
    /// How the supervisor hears of this failure.
    pub fn start_kind(&self) -> StartKind {
        match self {
            TemplateError::Read(_) | TemplateError::Damaged(_) => StartKind::BootedDamaged,
            TemplateError::Mismatch(_) => StartKind::BootedMismatch,
            _ => StartKind::BootedRefused,
        }
    }
}

/// Everything of a VM but its memory.
#[derive(Serialize, Deserialize)]
pub struct Saved {
    pub memory_bytes: u64,
    /// A digest of the CPUID each vCPU was given, in vCPU order.
    pub cpuid: Vec<String>,
    pub tsc_khz: u32,
    pub vcpus: Vec<VcpuState>,
    pub machine: MachineState,
    /// The virtio devices, in slot order.
    pub devices: Vec<SavedDevice>,
    pub uart: UartState,
}

/// One virtio device in a template: its transport's registers and queues,
/// and what the device keeps of its own.
#[derive(Serialize, Deserialize)]
pub struct SavedDevice {
    pub transport: TransportState,
    pub state: DeviceState,
}

/// The digest of a vCPU's CPUID entries.
pub fn cpuid_digest(cpuid: &kvm_bindings::CpuId) -> String {
    let mut hash = Sha256::new();
    for e in cpuid.as_slice() {
        for word in [e.function, e.index, e.flags, e.eax, e.ebx, e.ecx, e.edx] {
            hash.update(word.to_le_bytes());
        }
    }
    hex(&hash.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The state file's bytes: a header line (magic, digest of the rest, the
/// memory size), then the JSON. The header alone says whether a template is
/// whole, without reading and checking the state (see `is_complete`).
fn seal(saved: &Saved) -> Result<Vec<u8>, TemplateError> {
    let body = serde_json::to_vec(saved).map_err(|e| TemplateError::Write(std::io::Error::other(e)))?;
    let digest = hex(&Sha256::digest(&body));
    let mut out = format!("{MAGIC} {digest} {}\n", saved.memory_bytes).into_bytes();
    out.extend_from_slice(&body);
    Ok(out)
}

/// The header's digest and memory size, and where the body starts.
fn header(bytes: &[u8]) -> Result<(&str, u64, usize), TemplateError> {
    let newline = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| TemplateError::Damaged("no header".into()))?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| TemplateError::Damaged("bad header".into()))?;
    let mut words = header.split(' ');
    let (Some(MAGIC), Some(digest), Some(memory), None) = (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(TemplateError::Damaged(format!("not a template of this version ({header:.40})")));
    };
    let memory = memory.parse().map_err(|_| TemplateError::Damaged("bad memory size".into()))?;
    Ok((digest, memory, newline + 1))
}

fn unseal(bytes: &[u8]) -> Result<Saved, TemplateError> {
    let (digest, memory, start) = header(bytes)?;
    let body = &bytes[start..];
    if digest != hex(&Sha256::digest(body)) {
        return Err(TemplateError::Damaged("its state does not match its digest".into()));
    }
    let saved: Saved = serde_json::from_slice(body).map_err(|e| TemplateError::Damaged(e.to_string()))?;
    if saved.memory_bytes != memory {
        return Err(TemplateError::Damaged("its header and state disagree on the memory size".into()));
    }
    Ok(saved)
}

/// A template read back, checked against this host, ready to restore.
pub struct Template {
    pub saved: Saved,
    pub memory: File,
}

impl Template {
    /// Reads the template in `dir` for a VM of `memory_bytes` whose vCPUs
    /// get the CPUID digests `cpuid`.
    pub fn open(dir: &Path, memory_bytes: u64, cpuid: &[String]) -> Result<Template, TemplateError> {
        let mut bytes = Vec::new();
        File::open(dir.join(STATE_FILE)).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(TemplateError::Read)?;
        let saved = unseal(&bytes)?;
        let memory = File::open(dir.join(MEMORY_FILE)).map_err(TemplateError::Read)?;
        let len = memory.metadata().map_err(TemplateError::Read)?.len();
        if saved.memory_bytes != memory_bytes || len != memory_bytes {
            return Err(TemplateError::Damaged(format!(
                "its memory file holds {len} bytes, the VM has {memory_bytes}"
            )));
        }
        if saved.cpuid != cpuid || saved.vcpus.len() != cpuid.len() {
            return Err(TemplateError::Mismatch("the vCPUs' CPUID differs".into()));
        }
        Ok(Template { saved, memory })
    }
}

/// Whether `dir` holds a whole recording: a state of this version and a
/// memory file of the size its header names (a VMM killed while saving
/// leaves neither). Cheap: it reads the header only, since every run asks
/// and the supervisor keeps several templates; the VMM checks the state's
/// digest when it resumes one, and boots instead if it does not hold.
pub fn is_complete(dir: &Path) -> bool {
    let mut bytes = [0u8; HEADER_MAX];
    let Ok(read) = File::open(dir.join(STATE_FILE)).and_then(|f| f.read_at(&mut bytes, 0)) else { return false };
    let Ok((_, memory, _)) = header(&bytes[..read]) else { return false };
    std::fs::metadata(dir.join(MEMORY_FILE)).is_ok_and(|m| m.len() == memory)
}

/// A header line is shorter than this: magic, a SHA-256 in hex, a size.
const HEADER_MAX: usize = 128;

/// What the recording saves besides the vCPUs, shared with every vCPU
/// thread of a recording VM.
pub struct Recorder {
    pub pause: Pause,
    pub msr_list: Vec<u32>,
    vm: Arc<VmFd>,
    mem: GuestMemoryMmap,
    touched: pages::Touched,
    /// The template's files, open for writing from before the jail closes
    /// until the recording ends (`finish`): at the template point, before
    /// the guest runs its command. Nothing of the VMM may write them once
    /// a guest that could have taken over a thread runs; the supervisor
    /// adopts them after the VMM exits, and later runs resume them.
    files: Mutex<Option<Files>>,
    cpuid: Vec<String>,
    transports: Vec<Arc<Mutex<MmioTransport>>>,
    uart: Box<dyn Fn() -> UartState + Send + Sync>,
    done: AtomicBool,
}

/// The files a recording writes: `MEMORY_FILE` and `STATE_FILE`.
struct Files {
    memory: File,
    state: File,
}

/// Creates `name` in `dir` for writing; the directory is the supervisor's
/// fresh recording directory, so an existing file is an error.
fn create(dir: &Path, name: &str) -> Result<File, TemplateError> {
    OpenOptions::new()
        .write(true)
        .read(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(name))
        .map_err(TemplateError::Write)
}

/// The recording's parts that `Recorder::create` takes.
pub struct RecorderParts {
    pub vm: Arc<VmFd>,
    pub mem: GuestMemoryMmap,
    pub cpuid: Vec<String>,
    pub transports: Vec<Arc<Mutex<MmioTransport>>>,
    pub uart: Box<dyn Fn() -> UartState + Send + Sync>,
}

impl Recorder {
    /// Opens everything the recording writes, before the jail closes.
    pub fn create(kvm: &Kvm, dir: &Path, parts: RecorderParts) -> Result<Recorder, TemplateError> {
        let vcpus = parts.cpuid.len();
        let memory = create(dir, MEMORY_FILE)?;
        // Sized now: the jailed vCPU that writes it may not truncate files.
        memory.set_len(parts.mem.iter().map(|r| r.len()).sum()).map_err(TemplateError::Write)?;
        if vcpus > 1 {
            pause::install_kick_handler().map_err(TemplateError::Write)?;
        }
        Ok(Recorder {
            pause: Pause::new(vcpus),
            msr_list: cpu::msr_list(kvm)?,
            vm: parts.vm,
            mem: parts.mem,
            touched: pages::Touched::open().map_err(TemplateError::Read)?,
            files: Mutex::new(Some(Files { memory, state: create(dir, STATE_FILE)? })),
            cpuid: parts.cpuid,
            transports: parts.transports,
            uart: parts.uart,
            done: AtomicBool::new(false),
        })
    }

    /// Whether this is the first arrival at the template point: only that
    /// one is recorded, later writes of the port change nothing.
    pub fn first_arrival(&self) -> bool {
        !self.done.swap(true, Ordering::SeqCst)
    }

    /// Closes the template's files, saved or not: the recording is over.
    /// A recording never saved stays incomplete (an empty state).
    pub fn finish(&self) {
        drop(self.files.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// Saves the VM, given vCPU `me`'s state, the others parked by
    /// `pause.stop_others`, and `tsc_khz`. The device workers are parked
    /// while memory and the transports are read.
    pub fn save(
        &self,
        me: usize,
        mine: VcpuState,
        others: Vec<(usize, VcpuState)>,
        tsc_khz: u32,
    ) -> Result<(), TemplateError> {
        let started = Instant::now();
        let mut vcpus: Vec<Option<VcpuState>> = (0..self.cpuid.len()).map(|_| None).collect();
        vcpus[me] = Some(mine);
        for (id, state) in others {
            vcpus[id] = Some(state);
        }
        let vcpus: Vec<VcpuState> = vcpus
            .into_iter()
            .collect::<Option<_>>()
            .ok_or_else(|| TemplateError::Refused("a vCPU is missing".into()))?;
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner()).take();
        let files = files.ok_or_else(|| TemplateError::Refused("the recording is over".into()))?;
        worker::park_all(STOP_TIMEOUT).map_err(TemplateError::Refused)?;
        let result = (|| {
            let machine = MachineState::save(&self.vm)?;
            let devices = self
                .transports
                .iter()
                .enumerate()
                .map(|(slot, t)| {
                    let t = t.lock().unwrap_or_else(|p| p.into_inner());
                    let state = t.save_device_state().map_err(|e| {
                        TemplateError::Refused(format!("the virtio device in slot {slot} cannot be saved: {e}"))
                    })?;
                    Ok(SavedDevice { transport: t.save(), state })
                })
                .collect::<Result<_, TemplateError>>()?;
            let written = pages::write(&self.mem, &self.touched, &files.memory)?;
            let saved = Saved {
                memory_bytes: files.memory.metadata().map_err(TemplateError::Write)?.len(),
                cpuid: self.cpuid.clone(),
                tsc_khz,
                vcpus,
                machine,
                devices,
                uart: (self.uart)(),
            };
            let bytes = seal(&saved)?;
            files.state.write_all_at(&bytes, 0).map_err(TemplateError::Write)?;
            files.state.sync_data().map_err(TemplateError::Write)?;
            Ok(written)
        })();
        worker::open_all();
        let written = result?;
        tracing::info!("template recorded in {:?}: {} MiB of memory written", started.elapsed(), written >> 20);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_with_a_changed_byte_is_refused() {
        let body = br#"{"memory_bytes":1}"#;
        let mut bytes = format!("{MAGIC} {} 1\n", hex(&Sha256::digest(body))).into_bytes();
        bytes.extend_from_slice(body);
        // The digest holds, so what fails is the incomplete state.
        assert!(matches!(unseal(&bytes), Err(TemplateError::Damaged(_))));
        let last = bytes.len() - 2;
        bytes[last] = b'2';
        let err = unseal(&bytes).err().expect("refused");
        assert!(err.to_string().contains("digest"), "{err}");
        assert!(unseal(b"stockade-template-0 00\n{}").err().unwrap().to_string().contains("version"));
        assert!(unseal(b"stockade-template-1 00\n{}").err().unwrap().to_string().contains("version"));
        assert!(header(&bytes).is_ok_and(|(_, memory, _)| memory == 1));
        assert!(unseal(b"").is_err());
    }
}

//! The guest's view of the host in host mode, built from rootfs/host.toml:
//! which host directories are shared read-only, where tmpfs goes, which
//! files are generated (identity, network, trust) or hidden, and where the
//! workspace appears.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

// The user this layout is for is described in identity, beside their account files.
use super::identity;
pub use super::identity::User;
use crate::protocol::RootEntry;
use crate::protocol::vm_config::{IMAGE_DISK, SCRATCH_DISK, ShareConfig};
use crate::proxy::GuestTrust;
use crate::supervisor::channels::network::GuestSide;
use crate::util::text::wildcard_match;

/// The definition of the host-mode root (see the file for what each part is).
const HOST_ROOT: &str = include_str!("../../../rootfs/host.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostRoot {
    share: Vec<String>,
    tmpfs: Vec<TmpfsDir>,
    generate: Vec<Generated>,
    hide: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TmpfsDir {
    path: String,
    /// Octal, as chmod takes it.
    mode: String,
    #[serde(default)]
    owner: Owner,
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Owner {
    #[default]
    Root,
    User,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Generated {
    path: String,
    from: Generator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Generator {
    MachineId,
    Hostname,
    Hosts,
    Passwd,
    Group,
    ResolvConf,
    ProxyCa,
    CaBundle,
    Profile,
}

fn host_root() -> anyhow::Result<HostRoot> {
    toml::from_str(HOST_ROOT).context("the built-in rootfs/host.toml is malformed (a bug in this build)")
}
/// Inside the virtio-fs filesystem, the workspace lives under this name.
const WORKSPACE_SHARE: &str = "/workspace";

/// Where the guest's system comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// This host's own directories, shared read-only.
    Host,
    /// A root image (`run --image`), read-only under a writable overlay.
    Image,
}

/// The workspace: the git root above `cwd`, or `cwd` itself.
pub fn find_workspace(cwd: &Path, home: &Path) -> anyhow::Result<PathBuf> {
    let root = cwd.ancestors().find(|dir| dir.join(".git").exists()).unwrap_or(cwd).to_path_buf();
    if root == Path::new("/") {
        bail!("refusing to share / as the workspace: run stockade from a project directory");
    }
    if root == home {
        bail!(
            "refusing to share your whole home directory {} as the workspace: run stockade from a project directory",
            home.display()
        );
    }
    Ok(root)
}

/// What the guest is given: virtio-fs shares and the ordered root layout.
/// The files made from the network (resolv.conf, the CA, the profile) are
/// still to come: the shares are all the VMM needs, so it starts while the
/// proxy does, and [`Layout::complete`] adds those files once it is up.
#[derive(Debug)]
pub struct Layout {
    pub shares: Vec<ShareConfig>,
    /// The host's secrets under the shares, which the VMM never lets the
    /// guest open.
    pub secrets: Vec<PathBuf>,
    pub root: Vec<RootEntry>,
    /// The files to generate, and where in `root` they go: after the tmpfs
    /// mounts (everything added later goes just before the workspace, so
    /// this place stays put).
    generated: Vec<Generated>,
    generated_at: usize,
}

/// The layout for `system`: in image mode nothing of the host is shared but
/// the workspace (and the policy's mounts, added later).
pub fn layout(workspace: &Path, user: &User, system: System) -> anyhow::Result<Layout> {
    let spec = host_root()?;
    let mut shares = Vec::new();
    let mut root = Vec::new();
    if system == System::Image {
        root.push(RootEntry::Image { disk: IMAGE_DISK.to_string() });
    }
    let host_dirs: &[String] = if system == System::Host { &spec.share } else { &[] };
    for dir in host_dirs {
        let path = Path::new(dir);
        let Ok(meta) = fs::symlink_metadata(path) else { continue };
        if meta.file_type().is_symlink() {
            // Merged /usr: /bin -> usr/bin stays a link in the guest.
            let target = fs::read_link(path).with_context(|| format!("cannot read the link {dir}"))?;
            root.push(RootEntry::Symlink { link: dir.to_string(), target: target.to_string_lossy().into_owned() });
        } else if meta.is_dir() {
            shares.push(ShareConfig {
                guest_path: dir.to_string(),
                host_path: path.to_path_buf(),
                writable: false,
                record: None,
                limit: None,
            });
            root.push(RootEntry::Share { source: dir.to_string(), target: dir.to_string() });
        }
    }
    let home = user.home.to_string_lossy().into_owned();
    for dir in &spec.tmpfs {
        let target = if dir.path == "~" { home.clone() } else { dir.path.clone() };
        if dir.path == "~" && host_dirs.iter().any(|s| user.home.starts_with(s)) {
            // A home inside a shared system directory (root's /root is not one).
            continue;
        }
        let mode = u32::from_str_radix(&dir.mode, 8)
            .with_context(|| format!("rootfs/host.toml: tmpfs {} has a bad mode {:?}", dir.path, dir.mode))?;
        let (uid, gid) = if dir.owner == Owner::User { (user.uid, user.gid) } else { (0, 0) };
        root.push(RootEntry::Tmpfs { target, mode, uid, gid });
    }
    let generated: Vec<Generated> = spec
        .generate
        .into_iter()
        // A read-only share leaves nowhere to create a file the host lacks.
        .filter(|file| {
            let path = Path::new(&file.path);
            !host_dirs.iter().any(|d| path.starts_with(d)) || fs::symlink_metadata(path).is_ok()
        })
        .collect();
    let generated_at = root.len();
    let hidden: &[String] = if system == System::Host { &spec.hide } else { &[] };
    let secrets = hidden.iter().flat_map(|pattern| expand(pattern)).map(PathBuf::from).collect();
    let ws = workspace.to_str().context("the workspace path is not valid UTF-8")?;
    shares.push(ShareConfig {
        guest_path: WORKSPACE_SHARE.to_string(),
        host_path: workspace.to_path_buf(),
        writable: false,
        record: None,
        limit: None,
    });
    root.push(RootEntry::Overlay {
        source: WORKSPACE_SHARE.to_string(),
        target: ws.to_string(),
        disk: SCRATCH_DISK.to_string(),
    });
    Ok(Layout { shares, secrets, root, generated, generated_at })
}

impl Layout {
    /// Adds the generated files, now that the network they describe is up,
    /// and returns the variables that point at them (the CA's).
    pub fn complete(&mut self, user: &User, net: &GuestSide) -> anyhow::Result<Vec<(String, String)>> {
        let env = trust_env(&self.generated, net.trust.as_ref());
        let mut files = Vec::new();
        for file in &self.generated {
            let content = match file.from {
                Generator::MachineId => Some(identity::machine_id().context("cannot make a machine id")?),
                Generator::Hostname => Some(identity::hostname()),
                Generator::Hosts => Some(identity::hosts()),
                Generator::Passwd => Some(identity::passwd(user)),
                Generator::Group => Some(identity::group(user)),
                Generator::ResolvConf => Some(GuestSide::resolv_conf()),
                Generator::ProxyCa => net.trust.as_ref().map(|t| t.ca_pem.clone()),
                Generator::CaBundle => net.trust.as_ref().map(|t| t.bundle_pem.clone()),
                Generator::Profile => Some(GuestSide::profile(&[net.env.as_slice(), env.as_slice()].concat())),
            };
            if let Some(content) = content {
                files.push(RootEntry::File { target: file.path.clone(), content, mode: 0o644 });
            }
        }
        let at = self.generated_at.min(self.root.len());
        self.root.splice(at..at, files);
        self.generated.clear();
        Ok(env)
    }
}

/// The CA variables, pointing at the first file of each trust generator
/// that is placed; none without interception.
fn trust_env(generated: &[Generated], trust: Option<&GuestTrust>) -> Vec<(String, String)> {
    let first = |kind: Generator| generated.iter().find(|f| f.from == kind).map(|f| f.path.as_str());
    match (trust, first(Generator::ProxyCa), first(Generator::CaBundle)) {
        (Some(_), Some(ca), Some(bundle)) => GuestTrust::env(ca, bundle),
        _ => Vec::new(),
    }
}

/// The files a `hide` pattern names: a path, or a directory and a file
/// name with `*` wildcards. A path is kept whether or not the file exists
/// yet: the VMM refuses what comes to be there during the run (a shadow
/// tool's lock or temporary file, a key written later) by its place; a
/// directory there is not hidden. Wildcards name the files that exist,
/// and the pattern itself, by which the VMM refuses a file that comes to
/// match it during the run (a renewed key); unreadable directories hide
/// nothing more (the jailed VMM could not read them either).
fn expand(pattern: &str) -> Vec<String> {
    let path = Path::new(pattern);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    if !name.contains('*') {
        return if path.is_dir() { Vec::new() } else { vec![pattern.to_string()] };
    }
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| wildcard_match(name.as_bytes(), n.as_bytes())))
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.path().to_str().map(str::to_owned))
        .collect();
    found.sort();
    found.push(pattern.to_string());
    found
}

/// Adds the policy's mounts of host directories at their own paths: "ro"
/// read-only, "rw" writable on the host, "overlay" writable in the guest
/// only (the writes are thrown away with the VM). Returns the mounts it could
/// not place, with why, for the caller to report.
pub fn policy_mounts(
    mounts: &[crate::policy::Mount],
    home: &Path,
    shares: &mut Vec<ShareConfig>,
    root: &mut Vec<RootEntry>,
) -> Vec<String> {
    use crate::policy::MountMode;
    let mut skipped = Vec::new();
    for (index, mount) in mounts.iter().enumerate() {
        let path = mount.host_path(home);
        let Some(target) = path.to_str() else {
            skipped.push(format!("{} (the path is not valid UTF-8)", mount.path));
            continue;
        };
        if path.is_file() {
            skipped.push(format!("{} (a single file: only directories can be mounted)", mount.path));
            continue;
        }
        if !path.is_dir() {
            skipped.push(format!("{} (no such directory on this host)", mount.path));
            continue;
        }
        let source = format!("/mounts/{index}");
        let writable = mount.mode == MountMode::Rw;
        shares.push(ShareConfig {
            guest_path: source.clone(),
            host_path: path.clone(),
            writable,
            record: None,
            limit: None,
        });
        let target = target.to_string();
        let entry = match mount.mode {
            MountMode::Ro => RootEntry::Share { source, target },
            MountMode::Rw => RootEntry::ShareWritable { source, target },
            MountMode::Overlay => RootEntry::ShareScratch { source, target },
        };
        // Before the workspace overlay, which must stay the last entry.
        insert_before_workspace(root, entry);
    }
    skipped
}

/// Has the VMM record what the guest looks up in the workspace to the
/// sightings file `file` (see `protocol::seen`).
pub fn record_sightings(shares: &mut [ShareConfig], file: PathBuf) {
    if let Some(share) = shares.iter_mut().find(|s| s.guest_path == WORKSPACE_SHARE) {
        share.record = Some(file);
    }
}

/// Adds `entry` before the workspace overlay, which must stay the last
/// entry (a mount under the workspace would otherwise hide its files).
pub fn insert_before_workspace(root: &mut Vec<RootEntry>, entry: RootEntry) {
    let at = root.iter().position(|e| matches!(e, RootEntry::Overlay { .. })).unwrap_or(root.len());
    root.insert(at, entry);
}

/// A sign-in file (placeholders only) no agent state holds: generated in
/// place, readable by the user.
pub fn place_signin_file(file: &str, content: &[u8], home: &Path, root: &mut Vec<RootEntry>) {
    let target = match file.strip_prefix("~/") {
        Some(rel) => home.join(rel),
        None => PathBuf::from(file),
    };
    let entry = RootEntry::File {
        target: target.to_string_lossy().into_owned(),
        content: String::from_utf8_lossy(content).into_owned(),
        mode: 0o644,
    };
    insert_before_workspace(root, entry);
}

/// Adds the home toolchains, read-only at their own paths, before the
/// workspace overlay.
pub fn home_tool_shares(
    tools: &super::home_tools::HomeTools,
    shares: &mut Vec<ShareConfig>,
    root: &mut Vec<RootEntry>,
) {
    for (index, dir) in tools.dirs.iter().enumerate() {
        let Some(target) = dir.path.to_str() else { continue };
        let source = format!("/home-tools/{index}");
        shares.push(ShareConfig {
            guest_path: source.clone(),
            host_path: dir.path.clone(),
            writable: false,
            record: None,
            limit: None,
        });
        insert_before_workspace(root, RootEntry::Share { source, target: target.to_string() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            uid: 1000,
            gid: 1000,
            home: PathBuf::from("/home/alice"),
            name: "alice".into(),
            group: "alice".into(),
            shell: "/bin/sh".into(),
        }
    }

    #[test]
    fn the_built_in_definition_parses() {
        let spec = host_root().unwrap();
        assert!(spec.share.contains(&"/usr".to_string()));
        assert!(spec.tmpfs.iter().any(|t| t.path == "~" && t.owner == Owner::User));
        assert!(spec.hide.iter().any(|h| h.starts_with("/etc/ssh/ssh_host_")));
    }

    fn net(trust: bool) -> GuestSide {
        GuestSide {
            env: vec![("HTTPS_PROXY".into(), "http://127.0.0.1:3128".into())],
            placeholders: Vec::new(),
            signin_files: Vec::new(),
            known_hosts: None,
            ssh_agent: false,
            trust: trust.then(|| GuestTrust { ca_pem: "CA\n".into(), bundle_pem: "ROOTS\nCA\n".into() }),
        }
    }

    /// The layout with the generated files in, and their variables.
    fn complete(system: System, net: &GuestSide) -> (Layout, Vec<(String, String)>) {
        let mut laid = layout(Path::new("/home/alice/proj"), &user(), system).unwrap();
        let env = laid.complete(&user(), net).unwrap();
        (laid, env)
    }

    fn file<'a>(root: &'a [RootEntry], path: &str) -> Option<&'a str> {
        root.iter().find_map(|e| match e {
            RootEntry::File { target, content, .. } if target == path => Some(content.as_str()),
            _ => None,
        })
    }

    #[test]
    fn image_mode_shares_only_the_workspace() {
        let (Layout { shares, root, .. }, _) = complete(System::Image, &net(false));
        assert_eq!(shares.len(), 1, "{shares:?}");
        assert_eq!(shares[0].guest_path, "/workspace");
        assert_eq!(root[0], RootEntry::Image { disk: "/dev/vdb".into() });
        assert!(root.iter().any(|e| matches!(e, RootEntry::File { target, .. } if target == "/etc/passwd")));
        assert!(matches!(root.last(), Some(RootEntry::Overlay { .. })));
    }

    #[test]
    fn hide_patterns_expand_to_files_and_places() {
        let dir = std::env::temp_dir().join(format!("stockade-hide-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        for f in ["ssh_host_rsa_key", "ssh_host_rsa_key.pub", "ssh_config"] {
            fs::write(dir.join(f), "x").unwrap();
        }
        let pattern = format!("{}/ssh_host_*", dir.display());
        let found = expand(&pattern);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found.iter().all(|f| f.contains("ssh_host_")));
        assert_eq!(found.last(), Some(&pattern), "keys made during the run are refused by the pattern");
        let missing = format!("{}/missing", dir.display());
        assert_eq!(expand(&missing), vec![missing], "a file created during the run is refused by its place");
        assert!(expand(&format!("{}/sub", dir.display())).is_empty(), "directories are not hidden");
        assert!(expand("/nonexistent-dir/*").is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn workspace_is_the_git_root() {
        let dir = std::env::temp_dir().join(format!("stockade-ws-{}", std::process::id()));
        fs::create_dir_all(dir.join("proj/.git")).unwrap();
        fs::create_dir_all(dir.join("proj/src/deep")).unwrap();
        let ws = find_workspace(&dir.join("proj/src/deep"), Path::new("/home/alice")).unwrap();
        assert_eq!(ws, dir.join("proj"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_root_and_home() {
        assert!(find_workspace(Path::new("/"), Path::new("/home/a")).is_err());
        let home = std::env::temp_dir().join(format!("stockade-home-{}", std::process::id()));
        fs::create_dir_all(&home).unwrap();
        let err = find_workspace(&home, &home).unwrap_err().to_string();
        assert!(err.contains("home directory"), "{err}");
        fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn layout_mounts_workspace_last_and_hides_home() {
        let (Layout { shares, root, .. }, _) = complete(System::Host, &net(false));
        assert!(shares.iter().any(|s| s.guest_path == "/usr"));
        assert!(!shares.iter().any(|s| s.host_path == Path::new("/home/alice")));
        let last = root.last().unwrap();
        assert_eq!(
            last,
            &RootEntry::Overlay {
                source: "/workspace".into(),
                target: "/home/alice/proj".into(),
                disk: "/dev/vda".into()
            }
        );
        let home_pos =
            root.iter().position(|e| matches!(e, RootEntry::Tmpfs { target, .. } if target == "/home/alice"));
        assert!(home_pos.is_some(), "home must be a fresh tmpfs");
    }

    #[test]
    fn network_files_and_trust_come_from_the_definition() {
        let (plain, plain_env) = complete(System::Image, &net(false));
        assert!(file(&plain.root, "/etc/resolv.conf").is_some_and(|c| c.contains("nameserver 10.77.0.1")));
        assert!(file(&plain.root, "/run/stockade/ca.pem").is_none(), "no CA without interception");
        assert!(plain_env.is_empty(), "{plain_env:?}");

        let (trusting, trusting_env) = complete(System::Image, &net(true));
        assert_eq!(file(&trusting.root, "/run/stockade/ca.pem"), Some("CA\n"));
        assert_eq!(file(&trusting.root, "/run/stockade/ca-bundle.pem"), Some("ROOTS\nCA\n"));
        assert_eq!(file(&trusting.root, "/etc/ssl/certs/ca-certificates.crt"), Some("ROOTS\nCA\n"));
        let var = |name: &str| trusting_env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(var("SSL_CERT_FILE"), Some("/run/stockade/ca-bundle.pem"));
        assert_eq!(var("NODE_EXTRA_CA_CERTS"), Some("/run/stockade/ca.pem"));
        let profile = file(&trusting.root, "/etc/profile.d/stockade.sh").unwrap();
        assert!(profile.contains("export HTTPS_PROXY='http://127.0.0.1:3128'"), "{profile}");
        assert!(profile.contains("export SSL_CERT_FILE='/run/stockade/ca-bundle.pem'"), "{profile}");
    }

    /// Mounts added while the proxy starts go after the generated files, as
    /// they did when the files were made first: a policy mount over /etc/ssl
    /// still shows the host's directory, not a generated bundle under it.
    #[test]
    fn generated_files_keep_their_place_when_added_last() {
        let mut laid = layout(Path::new("/home/alice/proj"), &user(), System::Image).unwrap();
        let mount = RootEntry::Share { source: "/mounts/0".into(), target: "/etc/ssl".into() };
        insert_before_workspace(&mut laid.root, mount.clone());
        laid.complete(&user(), &net(true)).unwrap();
        let at = |wanted: &dyn Fn(&RootEntry) -> bool| laid.root.iter().position(wanted).unwrap();
        let bundle = at(&|e| matches!(e, RootEntry::File { target, .. } if target.starts_with("/etc/ssl/")));
        assert!(at(&|e| e == &RootEntry::Image { disk: "/dev/vdb".into() }) < bundle);
        assert!(bundle < at(&|e| e == &mount), "{:?}", laid.root);
        assert!(matches!(laid.root.last(), Some(RootEntry::Overlay { .. })));
    }

    #[test]
    fn host_mode_creates_files_only_outside_the_shares() {
        let (Layout { root, .. }, _) = complete(System::Host, &net(true));
        assert!(file(&root, "/run/stockade/ca.pem").is_some(), "/run is a tmpfs: created");
        let profile = file(&root, "/etc/profile.d/stockade.sh");
        assert_eq!(profile.is_some(), Path::new("/etc/profile.d/stockade.sh").exists(), "the host's /etc is read-only");
    }
}

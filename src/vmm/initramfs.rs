//! The guest's initramfs, built in memory at every start: the stockade binary
//! itself as /init, plus the few nodes the kernel needs before init runs. An
//! uncompressed newc cpio, so the kernel unpacks it with a plain copy.

const NEWC_MAGIC: &str = "070701";
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// An in-memory newc archive.
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    pub fn new() -> Cpio {
        Cpio { out: Vec::new(), ino: 1 }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & S_IFDIR != 0 { 2 } else { 1 },
            0, // mtime
            u32::try_from(data.len()).expect("newc sizes are 32-bit; the initramfs holds only our own binary"),
            0,
            0, // device of the archive's files
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).expect("our own short file names"),
            0, // check
        ];
        self.ino += 1;
        self.out.extend_from_slice(NEWC_MAGIC.as_bytes());
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }

    pub fn dir(&mut self, name: &str, perm: u32) -> &mut Self {
        self.entry(name, S_IFDIR | perm, (0, 0), &[]);
        self
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> &mut Self {
        self.entry(name, S_IFREG | perm, (0, 0), data);
        self
    }

    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> &mut Self {
        self.entry(name, S_IFCHR | perm, (major, minor), &[]);
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

/// The guest's initramfs with `init` (our own binary) as /init.
pub fn build(init: &[u8]) -> Vec<u8> {
    let mut cpio = Cpio::new();
    cpio.dir("dev", 0o755)
        .char_dev("dev/console", 0o600, 5, 1)
        .char_dev("dev/null", 0o666, 1, 3)
        .dir("proc", 0o555)
        .dir("sys", 0o555)
        .dir("tmp", 0o1777)
        .file("init", 0o755, init);
    cpio.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_end_with_the_trailer() {
        let archive = build(b"\x7fELF fake");
        assert_eq!(archive.len() % 4, 0);
        assert!(archive.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&archive);
        assert!(text.contains("dev/console\0"));
        assert!(text.contains("init\0"));
        assert!(text.contains("TRAILER!!!\0"));
    }

    #[test]
    fn cpio_tool_lists_our_archive() {
        let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("skipping: cpio is not installed");
            return;
        };
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&build(b"data")).unwrap();
        let out = child.wait_with_output().unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            listing.lines().collect::<Vec<_>>(),
            ["dev", "dev/console", "dev/null", "proc", "sys", "tmp", "init"]
        );
    }
}

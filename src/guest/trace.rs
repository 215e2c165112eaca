//! Milestones of the init in the kernel log, at debug level: with `-v` the
//! session's kernel.log shows them with the kernel's timestamps, so a slow
//! boot or export can be seen step by step; otherwise `quiet` hides them.
//! Keep them few: the kernel drops /dev/kmsg writes beyond ten in five
//! seconds unless booted with `printk.devkmsg=on`.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

static KMSG: Mutex<Option<File>> = Mutex::new(None);

/// Notes that the init reached `step`. Best effort: a missing /dev/kmsg
/// costs nothing but the note.
pub fn mark(step: &str) {
    let Ok(mut kmsg) = KMSG.lock() else { return };
    if kmsg.is_none() {
        *kmsg = std::fs::OpenOptions::new().write(true).open("/dev/kmsg").ok();
    }
    if let Some(file) = kmsg.as_mut() {
        // One write is one record; <6> is KERN_INFO, hidden by `quiet`.
        let _ = file.write_all(format!("<6>stockade-init: {step}\n").as_bytes());
    }
}

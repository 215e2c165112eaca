//! seccomp-bpf availability.

use std::fs;

/// The actions the kernel's seccomp supports, from procfs; `None` means the
/// kernel has no seccomp filter support.
pub fn available_actions() -> Option<Vec<String>> {
    let text = fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").ok()?;
    Some(text.split_whitespace().map(str::to_owned).collect())
}

/// Whether the actions our filters rely on are present.
pub fn filters_usable(actions: &[String]) -> bool {
    ["kill_process", "errno", "allow"].iter().all(|needed| actions.iter().any(|a| a == needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_kill_errno_allow() {
        let full: Vec<String> =
            "kill_process kill_thread trap errno user_notif trace log allow".split(' ').map(String::from).collect();
        assert!(filters_usable(&full));
        assert!(!filters_usable(&["allow".to_string()]));
    }
}

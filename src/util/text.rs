//! Text for people: untrusted bytes made safe to print, byte counts made
//! readable.

/// Bytes as text for messages, with anything unprintable escaped: control
/// characters (C0, DEL, C1), bytes that are not UTF-8, and the invisible
/// marks that reorder or hide text (`is_invisible`). Guest-chosen names
/// and symlink targets are shown through this, so a name cannot pose as
/// another on the terminal.
pub fn display_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else if is_invisible(c) {
                out.extend(c.escape_unicode());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Characters that change how text around them shows without showing
/// themselves: bidi marks, overrides and isolates, zero-width characters,
/// line and paragraph separators, the byte-order mark, soft hyphens,
/// blank fillers and tag characters.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// Formats a byte count the way people read disk sizes.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Whether `name` is what `pattern` says, where `*` stands for any run of
/// bytes and every other byte for itself (the hide patterns' wildcards).
/// Linear in the lengths whatever the stars: a name can come from the guest.
pub fn wildcard_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // The last star seen and the name position it was last tried at.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&b) if b == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // Let the last star take one more byte.
                Some((sp, sn)) => {
                    star = Some((sp, sn + 1));
                    p = sp + 1;
                    n = sn + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_any_run_and_nothing_else() {
        let m = |p: &str, n: &str| wildcard_match(p.as_bytes(), n.as_bytes());
        assert!(m("ssh_host_*", "ssh_host_ed25519_key"));
        assert!(m("ssh_host_*_key", "ssh_host_rsa_key"));
        assert!(!m("ssh_host_*_key", "ssh_host_rsa_key.pub"));
        assert!(!m("ssh_host_*", "ssh_config"));
        assert!(m("*", "anything") && m("*", "") && m("a*b*c", "abc") && m("*_key", "0002_key"));
        assert!(m("exact", "exact") && !m("exact", "exactly") && !m("exactly", "exact"));
        assert!(m("*a*a*a*a*a*a*b", &format!("{}b", "a".repeat(250))));
        assert!(!m("*a*a*a*a*a*a*b", &"a".repeat(255)), "a pathological pattern ends at once");
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn escapes_controls_bad_utf8_and_invisible_marks() {
        assert_eq!(display_bytes(b"a\x1b[2J\xff\xe2\x80\xaeb"), "a\\u{1b}[2J\\xff\\u{202e}b");
    }
}

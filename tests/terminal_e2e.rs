//! Interactive use: a guest shell on a real terminal (tmux), driven by
//! keystrokes and read back from the screen.

use std::time::Duration;

use crate::rig;
use crate::util::stockade_bin;

const T: Duration = Duration::from_secs(400);

/// Helpers for the scripts: `S` is stockade; `tm` is tmux on a server of the
/// script's own; `screen_has TEXT` waits (up to 120 s) until the pane shows
/// TEXT; `keys` types into the pane. Terminal settings are compared with
/// `stty -g`, which leaves out the window size.
fn script(body: &str) -> String {
    format!(
        r#"set -u
S={bin}
ws=$(mktemp -d /tmp/term.XXXXXX); cd "$ws"; git init -q
export SHELL=/bin/bash
tm() {{ tmux -L "stockade-$$" -f /dev/null "$@"; }}
trap 'tm kill-server 2>/dev/null' EXIT
screen_has() {{ i=0; until tm capture-pane -p -t t | grep -q -- "$1"; do i=$((i+1)); if [ $i -gt 1200 ]; then echo "screen never showed: $1"; tm capture-pane -p -t t; return 1; fi; sleep 0.1; done; }}
keys() {{ tm send-keys -t t "$@"; }}
{body}
"#,
        bin = stockade_bin()
    )
}

#[test]
fn guest_shell_behaves_like_a_local_terminal() {
    let Some(rig) = rig::require("guest_shell_behaves_like_a_local_terminal") else { return };
    let out = rig.sh(
        &script(
            r#"tm new-session -d -s t -x 100 -y 30 "stty -g > before.txt; $S shell; echo shell-exit-\$?; stty -g > after.txt; sleep 600"
set -e
keys 'echo hel''lo-guest; uname -r' Enter; screen_has hello-guest
keys 'stty size' Enter; screen_has '^30 100'
keys 'ls -l /proc/$$/fd | grep -c ptmx | sed s/^/masters-held-/' Enter; screen_has '^masters-held-0'
tm resize-window -t t -x 120 -y 40; sleep 1
keys 'stty size' Enter; screen_has '^40 120'
keys 'sleep 100' Enter; sleep 2; keys C-c; keys 'echo after-int-$?' Enter; screen_has after-int-130
keys 'sleep 4; echo slept-''done' Enter; sleep 1; keys C-z; screen_has Stopped
keys 'fg' Enter; screen_has slept-done
keys 'python3 -c "import curses; curses.wrapper(lambda s: (s.addstr(5, 10, \"CURSES-\" + \"DRAWN\"), s.refresh(), s.getch()))"' Enter
screen_has CURSES-DRAWN; keys q; sleep 1
keys 'echo job-''control-$(ps -o stat= -p $$)' Enter; screen_has 'job-control-S'
keys 'exit' Enter; screen_has shell-exit-0
sleep 1; cmp before.txt after.txt && echo terminal-restored"#,
        ),
        T,
    );
    assert_eq!(out.status, 0, "{out}");
    assert!(out.stdout.contains("terminal-restored"), "{out}");
}

#[test]
fn sigterm_restores_the_terminal() {
    let Some(rig) = rig::require("sigterm_restores_the_terminal") else { return };
    let out = rig.sh(
        &script(
            r#"tm new-session -d -s t -x 80 -y 24 "stty -g > before.txt; $S run -- sh -c 'echo guest-''running; exec sleep 100'; echo run-exit-\$?; stty -g > after.txt; sleep 600"
set -e
screen_has guest-running
pkill -TERM -f "^$S run -- sh -c"
screen_has run-exit-143
sleep 1; cmp before.txt after.txt && echo terminal-restored"#,
        ),
        T,
    );
    assert_eq!(out.status, 0, "{out}");
    assert!(out.stdout.contains("terminal-restored"), "{out}");
}

#[test]
fn guest_output_cannot_hide_or_garble_the_review() {
    let Some(rig) = rig::require("guest_output_cannot_hide_or_garble_the_review") else { return };
    // The command leaves the terminal in every state that would hide or
    // garble what follows: DEC line drawing in G0 and G1 (shifted out),
    // concealed text, a two-line scroll region, a hidden cursor, the
    // alternate screen, mouse reports, insert mode. The review must still
    // read plainly.
    let out = rig.sh(
        &script(
            r#"cat > hostile.sh <<'END'
echo plain > staged-file.txt
printf '\033(0\033)0\016\033[8m\033[1;2r\033[?25l\033[?1049h\033[?1000h\033[4h'
END
tm new-session -d -s t -x 100 -y 30 "$S run -- sh hostile.sh; sleep 600"
set -e
screen_has 'staged by session'
screen_has 'staged-file.txt'
echo "flags: $(tm display -p -t t '#{cursor_flag} #{alternate_on} #{scroll_region_upper} #{scroll_region_lower} #{mouse_any_flag} #{insert_flag}')"
echo "heading: $(tm capture-pane -p -e -t t | grep 'staged by session')""#,
        ),
        T,
    );
    assert_eq!(out.status, 0, "{out}");
    assert!(out.stdout.contains("flags: 1 0 0 29 0 0"), "the terminal was not put back: {out}");
    let heading = out.stdout.lines().find_map(|l| l.strip_prefix("heading: ")).expect("the heading line");
    assert!(!concealed_at(heading, "staged by session"), "the heading is concealed: {heading:?}");
}

/// Whether SGR 8 (concealed) is in force where `text` starts in `line`, a
/// line of `tmux capture-pane -e` (which writes attributes as SGR).
fn concealed_at(line: &str, text: &str) -> bool {
    let end = line.find(text).expect("the text is on the line");
    let mut concealed = false;
    for sgr in line[..end].split("\x1b[").skip(1) {
        let Some(params) = sgr.split_once('m').map(|(p, _)| p) else { continue };
        let mut params = params.split(';').map(|p| p.parse::<u32>().unwrap_or(0));
        while let Some(p) = params.next() {
            match p {
                0 => concealed = false,
                8 => concealed = true,
                28 => concealed = false,
                // Extended colours: 5;N or 2;R;G;B follow.
                38 | 48 | 58 => {
                    let skip = if params.next() == Some(5) { 1 } else { 3 };
                    for _ in 0..skip {
                        params.next();
                    }
                }
                _ => {}
            }
        }
    }
    concealed
}

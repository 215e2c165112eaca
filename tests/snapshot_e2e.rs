//! Templates end to end (see `vmm::template`): the first run of a VM shape
//! records one, later runs resume it with their own clock and random state,
//! a damaged template falls back to a boot, so does a resumed guest that
//! fails, and a guest that writes the template port itself changes nothing.

use crate::rig;
use crate::run_e2e::{T, script};

/// Its own cache and sessions, so that no other test's templates count.
const PRELUDE: &str = r#"export STOCKADE_CACHE=$ws.cache; mkdir "$STOCKADE_CACHE"
export STOCKADE_DATA_DIR=$ws.data; mkdir "$STOCKADE_DATA_DIR"
probe='head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"; echo; cat /proc/sys/kernel/random/boot_id; date +%s'
templates() { ls -A "$STOCKADE_CACHE/templates" | tr '\n' ' '; echo; }
"#;

fn how(stderr: &str) -> Vec<&'static str> {
    let mut seen = Vec::new();
    for line in stderr.lines() {
        for (needle, name) in [
            ("records a template", "recorded"),
            ("resumed a template", "resumed"),
            ("(no template used)", "booted"),
            ("is incomplete or damaged", "damaged"),
            ("its template is damaged", "damaged"),
        ] {
            if line.contains(needle) {
                seen.push(name);
            }
        }
    }
    seen
}

#[test]
fn runs_record_then_resume_a_template_each_with_its_own_clock_and_randomness() {
    let Some(rig) = rig::require("runs_record_then_resume_a_template") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             for i in 1 2 3; do $S run -v --cpus 1 -- sh -c \"$probe\" > run$i.out 2> run$i.err; echo \"status$i=$?\"; done
             echo host=$(date +%s)
             for i in 1 2 3; do sed \"s/^/run$i: /\" run$i.out; done
             cat run1.err run2.err run3.err >&2
             echo \"listed=$($S cache | grep -c '  [0-9a-f]\\{{16\\}}  ')\"
             $S run -v --cpus 1 --no-snapshot -- true 2>&1 | grep -o '(no template used)' >&2
             echo \"templates=$(templates)\""
        )),
        T,
    );
    for i in 1..=3 {
        assert!(out.stdout.contains(&format!("status{i}=0")), "{out}");
    }
    assert_eq!(how(&out.stderr), ["recorded", "resumed", "resumed", "booted"], "{out}");
    assert!(out.stdout.contains("listed=1"), "{out}");
    let lines = |run: &str| -> Vec<String> {
        out.stdout.lines().filter_map(|l| l.strip_prefix(&format!("{run}: ")).map(str::to_string)).collect()
    };
    let (a, b, c) = (lines("run1"), lines("run2"), lines("run3"));
    assert_eq!((a.len(), b.len(), c.len()), (3, 3, 3), "{out}");
    assert!(a[0] != b[0] && b[0] != c[0] && a[0] != c[0], "random bytes repeat across runs\n{out}");
    assert!(a[1] != b[1] && b[1] != c[1], "boot ids repeat across runs\n{out}");
    let host: i64 = out.stdout.lines().find_map(|l| l.strip_prefix("host=")).unwrap().trim().parse().unwrap();
    for run in [&b, &c] {
        let guest: i64 = run[2].trim().parse().unwrap();
        assert!((host - guest).abs() < 120, "a resumed guest's clock is off: {guest} vs {host}\n{out}");
    }
    assert!(!out.stdout.contains("templates=.rec"), "a recording was left behind\n{out}");
}

#[test]
fn a_damaged_template_boots_with_a_note_and_is_recorded_again() {
    let Some(rig) = rig::require("a_damaged_template_boots_with_a_note") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             $S run --cpus 1 -- true; echo first=$?
             for m in \"$STOCKADE_CACHE\"/templates/*/memory; do truncate -s 4096 \"$m\"; done
             $S run -v --cpus 1 -- echo after-damage 2> damaged.err; echo damaged=$?
             $S run -v --cpus 1 -- true 2> again.err; echo again=$?
             $S run -v --cpus 1 -- true 2> resumed.err; echo resumed=$?
             cat damaged.err again.err resumed.err >&2
             # Another binary is another template.
             cp $S ./stockade-copy
             ./stockade-copy run --cpus 1 -- true; echo copy=$?
             echo \"listed=$($S cache | grep -c '  [0-9a-f]\\{{16\\}}  ')\""
        )),
        T,
    );
    for status in ["first=0", "damaged=0", "again=0", "resumed=0", "copy=0"] {
        assert!(out.stdout.contains(status), "missing {status}\n{out}");
    }
    assert!(out.stdout.contains("after-damage"), "{out}");
    // A truncated memory file is found before the VM starts: the run boots
    // with a note and records the template again; the next one resumes it.
    assert_eq!(how(&out.stderr), ["damaged", "recorded", "resumed", "resumed"], "{out}");
    assert!(out.stdout.contains("listed=2"), "{out}");
}

#[test]
fn a_resumed_guest_that_fails_is_replaced_by_a_booting_one() {
    let Some(rig) = rig::require("a_resumed_guest_that_fails_is_replaced") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             $S run --cpus 1 -- true; echo first=$?
             # Memory of the right size that is no longer the guest's: it
             # passes every check made before the VM starts, and the
             # resumed guest dies at once.
             for m in \"$STOCKADE_CACHE\"/templates/*/memory; do
                 size=$(stat -c %s \"$m\"); rm \"$m\"; truncate -s \"$size\" \"$m\"
             done
             $S run -v --cpus 1 -- echo after-failure 2> failed.err; echo failed=$?
             $S run -v --cpus 1 -- true 2> again.err; echo again=$?
             cat failed.err again.err >&2"
        )),
        T,
    );
    for status in ["first=0", "failed=0", "again=0"] {
        assert!(out.stdout.contains(status), "missing {status}\n{out}");
    }
    assert!(out.stdout.contains("after-failure"), "{out}");
    assert!(out.stderr.contains("stopped before it called in; booting instead"), "{out}");
    // The failed resume, the boot in its place, then a recording: the
    // template went with the failure.
    assert_eq!(how(&out.stderr), ["resumed", "booted", "recorded"], "{out}");
}

#[test]
fn concurrent_first_runs_leave_one_template() {
    let Some(rig) = rig::require("concurrent_first_runs_leave_one_template") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             $S run --cpus 1 -- echo one > one.out 2>&1 & a=$!
             $S run --cpus 1 -- echo two > two.out 2>&1 & b=$!
             wait $a; echo a=$?; wait $b; echo b=$?
             cat one.out two.out
             echo \"templates=$(templates)\""
        )),
        T,
    );
    for status in ["a=0", "b=0", "one", "two"] {
        assert!(out.stdout.contains(status), "missing {status}\n{out}");
    }
    let listed = out.stdout.lines().find_map(|l| l.strip_prefix("templates=")).unwrap_or_default();
    let names: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(names.len(), 1, "one template, no leftovers: {names:?}\n{out}");
    assert!(!names[0].starts_with('.'), "{out}");
}

/// A root guest command that writes the template port, in the run that
/// records and in one that resumes, changes neither the template nor what
/// the next run sees.
#[test]
fn a_guest_writing_the_template_port_changes_nothing() {
    let Some(rig) = rig::require("a_guest_writing_the_template_port_changes_nothing") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             cat > poke.c <<'C'
#include <sys/io.h>
#include <stdio.h>
int main(void) {{
    if (ioperm(0x5c0, 1, 1) != 0) {{ perror(\"ioperm\"); return 1; }}
    for (int i = 0; i < 100000; i++) outb((unsigned char)i, 0x5c0);
    puts(\"poked\");
    return 0;
}}
C
             gcc -static -O1 -o poke poke.c || exit 1
             $S run -v --cpus 1 -- sh -c './poke && echo secret > /tmp/left-behind' 2> record.err; echo record=$?
             $S run -v --cpus 1 -- sh -c 'cat /tmp/left-behind 2>&1; ./poke; true' 2> resume.err; echo resume=$?
             $S run -v --cpus 1 -- sh -c 'cat /tmp/left-behind 2>&1; echo fine' 2> after.err; echo after=$?
             cat record.err resume.err after.err >&2"
        )),
        T,
    );
    for status in ["record=0", "resume=0", "after=0", "fine"] {
        assert!(out.stdout.contains(status), "missing {status}\n{out}");
    }
    // In the recording run the writes reach the VMM (100,000 port exits).
    // In the resumed one they do on hardware KVM; under the rig's QEMU,
    // whose software CPU only honours a port bitmap in a TSS marked
    // available (KVM restores the TSS busy, as hardware keeps it), the
    // guest's write faults first and the shell reports a segfault.
    assert!(out.stdout.matches("poked").count() >= 1, "{out}");
    assert!(!out.stdout.contains("secret"), "a later run saw the recording run's files\n{out}");
    assert_eq!(how(&out.stderr), ["recorded", "resumed", "resumed"], "{out}");
}

/// Two vCPUs (the default outside the rig): the recording parks the other
/// vCPU, and the resumed guest has both.
#[test]
fn a_two_vcpu_guest_records_and_resumes() {
    let Some(rig) = rig::require("a_two_vcpu_guest_records_and_resumes") else { return };
    let out = rig.sh(
        &script(&format!(
            "{PRELUDE}
             for i in 1 2; do $S run -v --cpus 2 -- nproc 2> run$i.err | sed \"s/^/nproc$i=/\"; done
             cat run1.err run2.err >&2"
        )),
        T,
    );
    assert!(out.stdout.contains("nproc1=2") && out.stdout.contains("nproc2=2"), "{out}");
    assert_eq!(how(&out.stderr), ["recorded", "resumed"], "{out}");
}

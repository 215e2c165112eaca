//! The file server under a low open-file limit: a guest that reads far more
//! files than the VMM may hold descriptors keeps a working, correct
//! workspace (`ls`, `git status`) for the rest of its run.

use std::time::Duration;

use crate::rig;
use crate::run_e2e::script;

/// Reading 100,000 files through FUSE on the rig's software CPU takes
/// minutes.
const SLOW: Duration = Duration::from_secs(1500);

/// Under `ulimit -n 4096` (soft and hard), where the passthrough server
/// used to run out after about 12,000 inodes, the guest reads 100,000
/// small files, then lists directories, reads one file and asks git about
/// a committed tree of 2,000 files, one of them changed. The timings
/// printed are the small-file read speed.
#[test]
fn a_guest_reading_100000_files_under_a_4096_descriptor_limit_keeps_a_correct_workspace() {
    let Some(rig) = rig::require("a_guest_reading_100000_files_under_a_4096_descriptor_limit") else { return };
    let out = rig.sh(
        &script(
            r##"ulimit -n 4096 || exit 7
             echo "limit=$(ulimit -Sn)/$(ulimit -Hn)"
             git init -q; git config user.email t@example.com; git config user.name t
             python3 -c '
import os
for d in range(1000):
    top = "many" if d >= 20 else "tracked"
    os.makedirs(f"{top}/d{d:04}")
    for f in range(100):
        with open(f"{top}/d{d:04}/f{f:03}", "w") as out:
            out.write(f"{d}/{f}\n")
'
             echo many/ > .gitignore
             git add -A; git commit -qm init
             $S run -- sh -c '
                 t0=$(date +%s%N)
                 n=$(find many tracked -type f | xargs cat | wc -l)
                 t1=$(date +%s%N)
                 echo "read=$n ms=$(( (t1 - t0) / 1000000 ))"
                 echo "ls=$(ls many/d0999 | wc -l) first=$(ls tracked/d0000 | head -n 1)"
                 echo "content=$(cat many/d0500/f050)"
                 echo "clean=$(git status --porcelain | wc -l)"
                 echo changed >> tracked/d0003/f007
                 echo "status=[$(git status --porcelain | tr "\n" " ")]"'
             echo "run=$?""##,
        ),
        SLOW,
    );
    eprintln!("{}", out.stdout.lines().filter(|l| l.contains("ms=")).collect::<Vec<_>>().join("\n"));
    assert!(out.stdout.contains("limit=4096/4096"), "{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains("read=100000 "), "every file reads\n{out}");
    assert!(out.stdout.contains("ls=100 first=f000"), "{out}");
    assert!(out.stdout.contains("content=500/50"), "{out}");
    assert!(out.stdout.contains("clean=0"), "the committed tree is clean\n{out}");
    assert!(out.stdout.contains("status=[ M tracked/d0003/f007 ]"), "exactly the changed file\n{out}");
    assert!(!out.stderr.contains("Too many open files"), "{out}");
}

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

/// Under `ulimit -n 1536`, the guest makes 6,000 files in 60 directories of
/// a policy's `rw` mount (the writable shares' server once held a descriptor
/// per inode the guest keeps, so it broke after a few thousand files under
/// such a limit; the files are four times the limit, not more, to keep the
/// test's minutes on the rig's software CPU few), reads them all back,
/// moves a directory and a file, removes one, and lists; the host then has
/// exactly those files, where the guest put them.
#[test]
fn a_guest_writing_6000_files_in_an_rw_mount_under_a_1536_descriptor_limit_leaves_exactly_them() {
    let Some(rig) = rig::require("a_guest_writing_6000_files_in_an_rw_mount_under_a_1536_descriptor_limit") else {
        return;
    };
    let out = rig.sh(
        &script(
            r##"ulimit -n 1536 || exit 7
             echo "limit=$(ulimit -Sn)/$(ulimit -Hn)"
             rw="$HOME/rw-many-$$"; mkdir "$rw"
             printf '[mounts]\n"%s" = "rw"\n' "$rw" > mounts.toml
             $S run --policy ./mounts.toml -- sh -c '
                 cd "$1" || exit 9
                 t0=$(date +%s%N)
                 d=0
                 while [ $d -lt 60 ]; do
                     mkdir d$d; f=0
                     while [ $f -lt 100 ]; do echo "$d/$f" > d$d/f$f; f=$((f + 1)); done
                     d=$((d + 1))
                 done
                 t1=$(date +%s%N)
                 n=$(find . -type f | xargs cat | wc -l)
                 t2=$(date +%s%N)
                 echo "wrote ms=$(( (t1 - t0) / 1000000 )) read=$n ms=$(( (t2 - t1) / 1000000 ))"
                 mv d0 moved && mv d1/f1 moved/from-d1 && rm d2/f2 || echo changes-failed
                 echo "ls=$(ls moved | wc -l) content=$(cat moved/from-d1) d1=$(ls d1 | wc -l) d2=$(ls d2 | wc -l)"
                 echo "guest-files=$(find . -type f | wc -l)"' sh "$rw"
             echo "run=$?"
             python3 -c '
import os, sys
rw = sys.argv[1]
got = set()
for top, _, names in os.walk(rw):
    for name in names:
        with open(os.path.join(top, name)) as f:
            got.add((os.path.relpath(os.path.join(top, name), rw), f.read()))
want = {("moved/from-d1", "1/1\n")}
for d in range(60):
    for f in range(100):
        if (d, f) not in ((1, 1), (2, 2)):
            want.add(("%s/f%d" % ("moved" if d == 0 else "d%d" % d, f), "%d/%d\n" % (d, f)))
print("host-files=%d diff=%d" % (len(got), len(got ^ want)))
print(sorted(got ^ want)[:5])
' "$rw"
             rm -rf "$rw""##,
        ),
        SLOW,
    );
    eprintln!("{}", out.stdout.lines().filter(|l| l.contains("ms=")).collect::<Vec<_>>().join("\n"));
    assert!(out.stdout.contains("limit=1536/1536"), "{out}");
    assert!(out.stdout.contains("run=0"), "{out}");
    assert!(out.stdout.contains(" read=6000 "), "every file reads back\n{out}");
    assert!(out.stdout.contains("ls=101 content=1/1 d1=99 d2=99"), "the guest's moves as it made them\n{out}");
    assert!(out.stdout.contains("guest-files=5999"), "{out}");
    assert!(out.stdout.contains("host-files=5999 diff=0"), "the host has exactly the guest's files\n{out}");
    assert!(!out.stdout.contains("changes-failed"), "{out}");
    assert!(!out.stderr.contains("Too many open files"), "{out}");
}

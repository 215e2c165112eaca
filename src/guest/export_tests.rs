//! Exporter tests: a fake upper/lower pair with markers named by path (no
//! root needed), and a real overlayfs mount in a private mount namespace
//! when running as root. Both check the end result too: export, stage and
//! apply onto the lower give what the merged overlay showed.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::*;
use crate::changes::{self, ApplyOptions, Store};
use crate::protocol::change_set::{Entry, Limits};

/// Markers named by upper path, standing in for device nodes and xattrs.
#[derive(Default)]
struct Fake {
    whiteouts: HashSet<PathBuf>,
    opaque: HashSet<PathBuf>,
}

impl Markers for Fake {
    fn is_whiteout(&self, path: &Path, _meta: &Metadata) -> bool {
        self.whiteouts.contains(path)
    }
    fn is_opaque(&self, path: &Path) -> bool {
        self.opaque.contains(path)
    }
    fn is_metacopy(&self, _path: &Path) -> bool {
        false
    }
    fn is_redirect(&self, _path: &Path) -> bool {
        false
    }
}

fn write(path: &Path, content: &str, mode: u32) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, content).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The host workspace before the session (the lower layer).
fn lower_tree(l: &Path) {
    write(&l.join("a.txt"), "a", 0o644);
    write(&l.join("b.txt"), "b old", 0o644);
    write(&l.join("c.txt"), "c", 0o644);
    write(&l.join("d/x"), "x", 0o644);
    write(&l.join("d/y"), "y", 0o644);
    write(&l.join("e.sh"), "echo", 0o644);
    write(&l.join("f.txt"), "f", 0o644);
    symlink("a.txt", l.join("link")).unwrap();
    symlink("a.txt", l.join("same-link")).unwrap();
    write(&l.join("nm/old/1.js"), "1", 0o644);
    write(&l.join("nm/2.js"), "2", 0o644);
    write(&l.join("sub/keep.txt"), "keep", 0o644);
    mkdir(&l.join("chm"), 0o755);
    write(&l.join("file2dir"), "was a file", 0o644);
    write(&l.join("dir2file/z"), "z", 0o644);
    write(&l.join("mvdir/m"), "moved", 0o644);
}

/// What the story in `lower_tree` and the tests' guest steps exports.
const STORY: [&str; 22] = [
    "b.txt file (was file)",
    "c.txt delete (was file)",
    "chm dir (was dir)",
    "d delete (was dir)",
    "dir2file file (was dir)",
    "e.sh mode (was file)",
    "file2dir dir (was file)",
    "file2dir/inner.txt file (was absent)",
    "h1 file (was absent)",
    "h2 file (was absent)",
    "link symlink (was symlink)",
    "mvdir delete (was dir)",
    "mvdir2 dir (was absent)",
    "mvdir2/m file (was absent)",
    "newdir dir (was absent)",
    "newdir/deep dir (was absent)",
    "newdir/deep/file.txt file (was absent)",
    "nm replaced dir (was dir)",
    "nm/new.js file (was absent)",
    "nm/old dir (was dir)",
    "nm/old/3.js file (was absent)",
    "sub/new.txt file (was absent)",
];

fn p(s: &str) -> RelPath {
    RelPath::new(s.as_bytes()).unwrap()
}

/// A file tree with modes, for comparing workspaces.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>, u32),
    Dir(u32),
    Link(PathBuf),
}

/// The tree below `root`, without special files.
fn walk(root: &Path) -> BTreeMap<String, Node> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                out.insert(rel, Node::Link(fs::read_link(&path).unwrap()));
            } else if meta.is_dir() {
                out.insert(rel, Node::Dir(mode));
                go(root, &path, out);
            } else if meta.is_file() {
                out.insert(rel, Node::File(fs::read(&path).unwrap(), mode));
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

/// Exports, stages into a fresh store, and returns the entries and report.
fn export_and_stage(
    upper: &Path,
    lower: &Path,
    markers: &dyn Markers,
    session: &Path,
) -> (Vec<Entry>, ExportReport, Store) {
    let mut writer = Writer::new(Vec::new()).unwrap();
    let report = export(upper, lower, markers, &mut writer).unwrap();
    let (bytes, _) = writer.finish().unwrap();
    let store = Store::open(session).unwrap();
    store.stage(&bytes[..], Limits::default()).unwrap();
    let entries = store.entries().unwrap().into_iter().map(|e| e.entry).collect();
    (entries, report, store)
}

fn summary(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            let base = serde_json::to_value(&e.base).unwrap()["type"].as_str().unwrap().to_string();
            format!("{} {} (was {base})", e.path, e.kind.word())
        })
        .collect()
}

#[test]
fn exports_a_fake_overlay_and_applies_to_the_merged_view() {
    let tmp = tempfile::tempdir().unwrap();
    let (l, u) = (tmp.path().join("lower"), tmp.path().join("upper"));
    lower_tree(&l);
    let mut m = Fake::default();
    fs::create_dir(&u).unwrap();
    write(&u.join("b.txt"), "b new!", 0o644);
    for gone in ["c.txt", "d", "gone-already", "mvdir"] {
        write(&u.join(gone), "", 0o644);
        m.whiteouts.insert(u.join(gone));
    }
    write(&u.join("e.sh"), "echo", 0o4755); // copied up by chmod, setuid too
    write(&u.join("f.txt"), "f", 0o644); // copied up by touch
    symlink("b.txt", u.join("link")).unwrap();
    symlink("a.txt", u.join("same-link")).unwrap();
    write(&u.join("nm/new.js"), "new", 0o644);
    write(&u.join("nm/old/3.js"), "3", 0o644);
    m.opaque.insert(u.join("nm"));
    write(&u.join("sub/new.txt"), "new", 0o644);
    mkdir(&u.join("chm"), 0o700);
    write(&u.join("newdir/deep/file.txt"), "deep", 0o600);
    write(&u.join("h1"), "hard", 0o644);
    fs::hard_link(u.join("h1"), u.join("h2")).unwrap();
    nix::unistd::mkfifo(&u.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    write(&u.join("file2dir/inner.txt"), "inner", 0o644);
    m.opaque.insert(u.join("file2dir"));
    write(&u.join("dir2file"), "now a file", 0o644);
    write(&u.join("mvdir2/m"), "moved", 0o644);

    let (entries, report, store) = export_and_stage(&u, &l, &m, &tmp.path().join("session"));
    assert_eq!(summary(&entries), STORY);
    assert_eq!((report.skipped, report.hard_links, report.unchanged_copies), (1, 1, 2));
    assert_eq!(store.report().unwrap().skipped, [crate::protocol::change_set::skipped(b"fifo", SpecialKind::Fifo)]);
    assert_eq!(store.report().unwrap().stripped, [p("e.sh")]);
    // Deleting a tree records what was in it.
    let d = entries.iter().find(|e| e.path == p("d")).unwrap();
    assert!(matches!(d.base, Base::Dir { tree: Some(t), .. } if t.entries == 2));

    let result = changes::apply(&store, &l, &ApplyOptions::all()).unwrap();
    assert_eq!(result.skipped(), 0, "{result:?}");
    // Hard links arrive as independent copies.
    let ino = |n: &str| std::os::unix::fs::MetadataExt::ino(&fs::metadata(l.join(n)).unwrap());
    assert_ne!(ino("h1"), ino("h2"));
    let node = |s: &str, mode| Node::File(s.as_bytes().to_vec(), mode);
    let expected: BTreeMap<String, Node> = [
        ("a.txt", node("a", 0o644)),
        ("b.txt", node("b new!", 0o644)),
        ("chm", Node::Dir(0o700)),
        ("dir2file", node("now a file", 0o644)),
        ("e.sh", node("echo", 0o755)),
        ("f.txt", node("f", 0o644)),
        ("file2dir", Node::Dir(0o755)),
        ("file2dir/inner.txt", node("inner", 0o644)),
        ("h1", node("hard", 0o644)),
        ("h2", node("hard", 0o644)),
        ("link", Node::Link("b.txt".into())),
        ("mvdir2", Node::Dir(0o755)),
        ("mvdir2/m", node("moved", 0o644)),
        ("newdir", Node::Dir(0o755)),
        ("newdir/deep", Node::Dir(0o755)),
        ("newdir/deep/file.txt", node("deep", 0o600)),
        ("nm", Node::Dir(0o755)),
        ("nm/new.js", node("new", 0o644)),
        ("nm/old", Node::Dir(0o755)),
        ("nm/old/3.js", node("3", 0o644)),
        ("same-link", Node::Link("a.txt".into())),
        ("sub", Node::Dir(0o755)),
        ("sub/keep.txt", node("keep", 0o644)),
        ("sub/new.txt", node("new", 0o644)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut got = walk(&l);
    // Directory modes the test did not set follow the umask.
    for (path, node) in got.iter_mut() {
        if let (Node::Dir(mode), Some(Node::Dir(want))) = (node, expected.get(path))
            && *want == 0o755
        {
            *mode = 0o755;
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn an_unchanged_copy_up_exports_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (l, u) = (tmp.path().join("lower"), tmp.path().join("upper"));
    lower_tree(&l);
    // Touching files and writing below an existing directory copies up
    // their parents with the same mode.
    write(&u.join("a.txt"), "a", 0o644);
    mkdir(&u.join("nm/old"), fs::metadata(l.join("nm/old")).unwrap().permissions().mode() & 0o7777);
    mkdir(&u.join("sub"), fs::metadata(l.join("sub")).unwrap().permissions().mode() & 0o7777);
    write(&u.join("sub/keep.txt"), "keep", 0o644);
    let (entries, report, _) = export_and_stage(&u, &l, &Fake::default(), &tmp.path().join("session"));
    assert_eq!(summary(&entries), Vec::<String>::new());
    assert_eq!(report.unchanged_copies, 2);
}

#[test]
fn a_lower_symlink_is_not_followed_for_bases() {
    let tmp = tempfile::tempdir().unwrap();
    let (l, u, elsewhere) = (tmp.path().join("lower"), tmp.path().join("upper"), tmp.path().join("elsewhere"));
    write(&elsewhere.join("x"), "outside", 0o644);
    fs::create_dir(&l).unwrap();
    symlink(&elsewhere, l.join("lib")).unwrap();
    // The guest replaced the symlink by a directory holding x.
    write(&u.join("lib/x"), "inside", 0o644);
    let mut m = Fake::default();
    m.opaque.insert(u.join("lib"));
    let (entries, _, _) = export_and_stage(&u, &l, &m, &tmp.path().join("session"));
    assert_eq!(summary(&entries), ["lib dir (was symlink)", "lib/x file (was absent)"]);
}

#[test]
fn a_redirected_directory_is_refused() {
    struct Redirects;
    impl Markers for Redirects {
        fn is_whiteout(&self, _: &Path, _: &Metadata) -> bool {
            false
        }
        fn is_opaque(&self, _: &Path) -> bool {
            false
        }
        fn is_metacopy(&self, _: &Path) -> bool {
            false
        }
        fn is_redirect(&self, _: &Path) -> bool {
            true
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("upper/renamed")).unwrap();
    fs::create_dir_all(tmp.path().join("lower")).unwrap();
    let mut writer = Writer::new(Vec::new()).unwrap();
    let err = export(&tmp.path().join("upper"), &tmp.path().join("lower"), &Redirects, &mut writer).unwrap_err();
    assert!(matches!(err, ExportError::Redirect { .. }), "{err}");
}

/// The same story on a real overlayfs, which needs root for the mount and
/// for reading `trusted.*` xattrs. The merged view is copied out before
/// unmounting and compared with the lower after export, stage and apply.
#[test]
fn exports_a_real_overlayfs_upper_layer() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !nix::unistd::geteuid().is_root() {
        assert!(!ci, "CI runs as root; this test must not be skipped there");
        eprintln!("skipped: mounting overlayfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = |n: &str| {
        let d = tmp.path().join(n);
        fs::create_dir_all(&d).unwrap();
        d
    };
    let (l, u, w, m, e) = (dir("lower"), dir("upper"), dir("work"), dir("merged"), dir("expected"));
    lower_tree(&l);
    let script = r#"set -e
mount -t overlay overlay -o "lowerdir=$L,upperdir=$U,workdir=$W,$OPTIONS" "$M"
cd "$M"
printf 'b new!' > b.txt
rm c.txt
rm -r d
chmod 4755 e.sh
touch f.txt
ln -sfn b.txt link
touch -h same-link
rm -rf nm && mkdir -p nm/old && echo new > nm/new.js && echo 3 > nm/old/3.js
echo new > sub/new.txt
chmod 700 chm
mkdir -p newdir/deep && echo deep > newdir/deep/file.txt
echo hard > h1 && ln h1 h2
mkfifo fifo
rm file2dir && mkdir file2dir && echo inner > file2dir/inner.txt
rm -r dir2file && echo "now a file" > dir2file
mv mvdir mvdir2
cp -a . "$E"
cd /
umount "$M"
"#;
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("L", &l)
        .env("U", &u)
        .env("W", &w)
        .env("M", &m)
        .env("E", &e)
        .env("OPTIONS", OVERLAY_OPTIONS)
        .output();
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!ci, "overlay setup failed under CI: {why}");
            eprintln!("skipped: cannot set up an overlay here: {why}");
            return;
        }
        Err(err) => {
            assert!(!ci, "unshare is missing under CI: {err}");
            eprintln!("skipped: unshare: {err}");
            return;
        }
    };
    drop(out);
    let (entries, report, store) = export_and_stage(&u, &l, &Overlayfs, &tmp.path().join("session"));
    // Overlayfs marked what the fake markers claim: the same change set.
    assert_eq!(summary(&entries), STORY);
    assert_eq!((report.skipped, report.hard_links, report.unchanged_copies), (1, 1, 2));
    let result = changes::apply(&store, &l, &ApplyOptions::all()).unwrap();
    assert_eq!(result.skipped(), 0, "{result:?}");
    let mut expected = walk(&e);
    // setuid is dropped on the way to the host.
    if let Some(Node::File(_, mode)) = expected.get_mut("e.sh") {
        *mode &= 0o777;
    }
    assert_eq!(walk(&l), expected);
}

/// A lower of `dirs` × `files` untouched files around the same few changes.
fn big_lower(l: &Path, dirs: usize, files: usize) {
    for d in 0..dirs {
        for f in 0..files {
            write(&l.join(format!("node_modules/p{d}/f{f}.js")), "x", 0o644);
        }
    }
    write(&l.join("src/main.rs"), "old", 0o644);
    for f in 0..5 {
        write(&l.join(format!("build/out{f}")), "o", 0o644);
    }
}

#[test]
fn export_looks_at_the_lower_only_along_the_changed_paths() {
    let counts = |dirs: usize, files: usize| {
        let tmp = tempfile::tempdir().unwrap();
        let (l, u) = (tmp.path().join("lower"), tmp.path().join("upper"));
        big_lower(&l, dirs, files);
        let mut m = Fake::default();
        write(&u.join("src/main.rs"), "new", 0o644);
        write(&u.join("src/lib.rs"), "lib", 0o644);
        write(&u.join("node_modules/p1/f0.js"), "y", 0o644);
        write(&u.join("build"), "", 0o644);
        m.whiteouts.insert(u.join("build"));
        let (entries, report, _) = export_and_stage(&u, &l, &m, &tmp.path().join("session"));
        assert_eq!(entries.len(), 4, "{entries:?}");
        (report.lower_lookups, report.lower_tree_entries)
    };
    // Upper entries: build, node_modules, node_modules/p1, node_modules/p1/f0.js,
    // src, src/lib.rs, src/main.rs; the deleted build/ holds 5 files.
    assert_eq!(counts(3, 3), (7, 5));
    assert_eq!(counts(20, 50), (7, 5), "a thousand more lower files cost nothing");
}

#[test]
fn a_sparse_upper_file_is_exported_as_holes() {
    let tmp = tempfile::tempdir().unwrap();
    let (upper, lower) = (tmp.path().join("upper"), tmp.path().join("lower"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&lower).unwrap();
    // Hashing is over every logical byte; keep it short in debug builds.
    let size: u64 = if cfg!(debug_assertions) { 64 << 20 } else { 1 << 30 };
    let file = fs::File::create(upper.join("disk.img")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0xa5; 4096], (size / 3) & !4095).unwrap();
    file.set_len(size).unwrap();
    drop(file);
    let mut writer = Writer::new(Vec::new()).unwrap();
    let report = export(&upper, &lower, &Fake::default(), &mut writer).unwrap();
    let (stream, summary) = writer.finish().unwrap();
    assert_eq!((report.files, report.bytes), (1, size));
    assert_eq!(summary.stored, 4096, "only the data is carried");
    assert!(stream.len() < 16 << 10, "{} bytes on the wire for {size} sparse bytes", stream.len());
}

//! The change pipeline's benchmarks, ignored tests so they need no extra
//! binary. They sit above `guest` and `changes`, since they run both. `benches/apply.sh`: guest export of 10,000 files, staging them,
//! and applying them, each the median of a few runs, plus the filesystem's
//! own floor for comparison.
//! `benches/review.sh`: a 10-file change in a workspace of 1,000,000 files,
//! exported, reviewed and applied. They print numbers and assert nothing
//! about time.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::changes::work::{Work, measure};
use crate::changes::{ApplyOptions, Selection, Store, apply, tree_digest_at};
use crate::guest::export::{Markers, export};
use crate::protocol::change_set::{Limits, Writer};
use crate::review::{self, ApplyMode, Console, Pager, Painter, Summary, SummaryOptions};

const FILES: usize = 10_000;

struct NoMarkers;

impl Markers for NoMarkers {
    fn is_whiteout(&self, _: &Path, _: &fs::Metadata) -> bool {
        false
    }
    fn is_opaque(&self, _: &Path) -> bool {
        false
    }
    fn is_metacopy(&self, _: &Path) -> bool {
        false
    }
    fn is_redirect(&self, _: &Path) -> bool {
        false
    }
}

/// 10,000 small files (100 to 4,000 bytes) in 100 directories.
fn populate(root: &Path, count: usize, per_dir: usize) {
    for i in 0..count {
        let dir = root.join(format!("pkg{:03}/lib", i / per_dir));
        if i % per_dir == 0 {
            fs::create_dir_all(&dir).unwrap();
        }
        let size = 100 + (i * 37) % 3900;
        let content: Vec<u8> = (0..size).map(|b: usize| (b ^ i).to_le_bytes()[0]).collect();
        fs::write(dir.join(format!("file{i}.js")), content).unwrap();
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn row(what: &str, samples: Vec<Duration>, count: usize) {
    let m = median(samples);
    let per = m.as_secs_f64() * 1e6 / count as f64;
    println!("{what:<48} {:>9.3} s {:>9.1} µs/file", m.as_secs_f64(), per);
}

#[test]
#[ignore = "a benchmark: run benches/apply.sh"]
fn pipeline() {
    let base = std::env::var_os("STOCKADE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let runs: usize = std::env::var("STOCKADE_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let scratch = tempfile::tempdir_in(&base).unwrap();
    let upper = scratch.path().join("upper");
    let lower = scratch.path().join("lower");
    fs::create_dir(&lower).unwrap();
    populate(&upper, FILES, 100);

    let (mut export_t, mut stage_t, mut apply_t, mut floor_t) = (vec![], vec![], vec![], vec![]);
    let mut stream = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let out = fs::File::create(scratch.path().join("stream")).unwrap();
        let mut writer = Writer::new(std::io::BufWriter::new(out)).unwrap();
        export(&upper, &lower, &NoMarkers, &mut writer).unwrap();
        writer.finish().unwrap().0.flush().unwrap();
        export_t.push(started.elapsed());
        if run == 0 {
            stream = fs::read(scratch.path().join("stream")).unwrap();
        }

        let session = scratch.path().join(format!("session{run}"));
        let store = Store::open(&session).unwrap();
        let started = Instant::now();
        store.stage(&stream[..], Limits::default()).unwrap();
        stage_t.push(started.elapsed());

        let ws = scratch.path().join(format!("ws{run}"));
        fs::create_dir(&ws).unwrap();
        let started = Instant::now();
        let report = apply(&store, &ws, &ApplyOptions::all()).unwrap();
        apply_t.push(started.elapsed());
        assert_eq!(report.applied.len(), FILES + 2 * (FILES / 100));

        // The floor: the same files written by temp + rename, no checks, no journal.
        let floor = scratch.path().join(format!("floor{run}"));
        let started = Instant::now();
        for i in 0..FILES {
            let dir = floor.join(format!("pkg{:03}/lib", i / 100));
            if i % 100 == 0 {
                fs::create_dir_all(&dir).unwrap();
            }
            let tmp = dir.join(format!(".tmp{i}"));
            fs::write(&tmp, b"0123456789abcdef").unwrap();
            fs::rename(&tmp, dir.join(format!("file{i}.js"))).unwrap();
        }
        nix::unistd::syncfs(fs::File::open(&floor).unwrap()).unwrap();
        floor_t.push(started.elapsed());
    }
    println!("\nchange pipeline, median of {runs} runs, in {}", base.display());
    row("export: walk upper, hash, write the stream", export_t, FILES);
    println!("{:<48} {:>9.1} MiB", "  stream size", stream.len() as f64 / (1 << 20) as f64);
    row("stage: read the stream into the store", stage_t, FILES);
    row("apply: 10,000 new files in 100 new directories", apply_t, FILES);
    row("  floor: temp + rename + syncfs, nothing else", floor_t, FILES);
}

// The per-run cost of a small change in a big workspace (issue #22), run by
// `benches/review.sh`: a 10-file change exported against a workspace of
// 1,000,000 files, then reviewed and applied as `stockade run --apply all`,
// `stockade diff` and `stockade apply` do it. Each mode runs in a process
// of its own, so its peak memory is its own.

const BIG_DIRS: usize = 1000;
const BIG_FILES: usize = 1000;
/// The first `IGNORED_DIRS` directories go under the ignored node_modules/.
const IGNORED_DIRS: usize = 900;

fn big_dir(d: usize) -> String {
    let top = if d < IGNORED_DIRS { "node_modules" } else { "src" };
    format!("{top}/pkg{d:04}")
}

/// 1,000 directories of 1,000 small files: 900,000 under an ignored
/// node_modules/, 100,000 under src/, committed when git is there.
fn big_workspace(ws: &Path) {
    if ws.join(big_dir(BIG_DIRS - 1)).join(format!("f{:04}.js", BIG_FILES - 1)).exists() {
        return;
    }
    println!("creating {} files in {} (once)", BIG_DIRS * BIG_FILES, ws.display());
    fs::create_dir_all(ws).unwrap();
    fs::write(ws.join(".gitignore"), "node_modules/\n*.log\n").unwrap();
    for d in 0..BIG_DIRS {
        let dir = ws.join(big_dir(d));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..BIG_FILES {
            fs::write(dir.join(format!("f{i:04}.js")), format!("// {d} {i}\nmodule.exports = {i};\n")).unwrap();
        }
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(ws)
            .env("GIT_AUTHOR_NAME", "bench")
            .env("GIT_AUTHOR_EMAIL", "bench@example.com")
            .env("GIT_COMMITTER_NAME", "bench")
            .env("GIT_COMMITTER_EMAIL", "bench@example.com")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !(git(&["init", "-q"]) && git(&["add", "-A"]) && git(&["commit", "-qm", "base"])) {
        println!("(no git: the workspace is not a repository)");
    }
}

/// KiB from /proc/self/status (`VmRSS`, `VmHWM`).
fn proc_kib(field: &str) -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the peak resident size to the current one (Linux 4.0+), so that
/// `VmHWM` afterwards is the peak of what follows.
fn reset_peak() {
    let _ = fs::write("/proc/self/clear_refs", "5");
}

/// Times `f`, its peak resident memory and its workspace work.
fn phase<T>(f: impl FnOnce() -> T) -> (T, Duration, u64, Work) {
    reset_peak();
    let started = Instant::now();
    let (result, work) = measure(f);
    (result, started.elapsed(), proc_kib("VmHWM"), work)
}

struct Whiteouts(HashSet<PathBuf>);

impl Markers for Whiteouts {
    fn is_whiteout(&self, path: &Path, _: &fs::Metadata) -> bool {
        self.0.contains(path)
    }
    fn is_opaque(&self, _: &Path) -> bool {
        false
    }
    fn is_metacopy(&self, _: &Path) -> bool {
        false
    }
    fn is_redirect(&self, _: &Path) -> bool {
        false
    }
}

/// An upper layer changing 10 files of `ws`, different ones for each `n`
/// (runs apply to the same workspace): 3 committed files modified, 3 added
/// (one in a new directory), 1 deleted, 1 ignored file modified and 1
/// added, a new log file (ignored by *.log).
fn small_change(upper: &Path, n: usize) -> Whiteouts {
    let (a, b) = (IGNORED_DIRS + n % 50, IGNORED_DIRS + 50 + n % 50);
    let c = n % IGNORED_DIRS;
    let write = |rel: String, content: &str| {
        let path = upper.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    };
    let round = n / 50;
    write(format!("{}/f{:04}.js", big_dir(a), 10 + round), "// changed\n");
    write(format!("{}/f{:04}.js", big_dir(a), 20 + round), "// changed too\n");
    write(format!("{}/f{:04}.js", big_dir(b), 30 + round), "// and this\n");
    write(format!("{}/new-{n}.js", big_dir(a)), "// new\n");
    write(format!("src/new-{n}/index.js"), "export {};\n");
    write(format!("tools-{n}.js"), "// tool\n");
    write(format!("{}/f{:04}.js", big_dir(b), 40 + round), "");
    write(format!("{}/f{:04}.js", big_dir(c), 50 + round), "// patched dependency\n");
    write(format!("{}/new-{n}.js", big_dir(c)), "// generated\n");
    write(format!("run-{n}.log"), "log\n");
    Whiteouts([upper.join(format!("{}/f{:04}.js", big_dir(b), 40 + round))].into())
}

fn work_text(w: &Work) -> String {
    format!("{} dirs resolved, {} stats, {} names listed", w.resolves, w.stats, w.listed)
}

/// One review mode in this process; `benches/review.sh` runs each in its own.
#[test]
#[ignore = "a benchmark: run benches/review.sh"]
fn review_big_workspace() {
    let Some(ws) = std::env::var_os("STOCKADE_BENCH_WORKSPACE").map(PathBuf::from) else {
        println!("set STOCKADE_BENCH_WORKSPACE (benches/review.sh does)");
        return;
    };
    let mode = std::env::var("STOCKADE_BENCH_MODE").unwrap_or_else(|_| "review".into());
    let base = std::env::var_os("STOCKADE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    big_workspace(&ws);
    let scratch = tempfile::tempdir_in(&base).unwrap();
    let counter = ws.join(".git/stockade-bench-runs");
    let n: usize = fs::read_to_string(&counter).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
    let _ = fs::write(&counter, (n + 1).to_string());

    let upper = scratch.path().join("upper");
    let markers = small_change(&upper, n);
    let mut stream = Vec::new();
    let report = {
        let mut writer = Writer::new(&mut stream).unwrap();
        let report = export(&upper, &ws, &markers, &mut writer).unwrap();
        writer.finish().unwrap();
        report
    };
    let store = Store::open(&scratch.path().join("session")).unwrap();
    store.stage(&stream[..], Limits::default()).unwrap();
    let before = proc_kib("VmRSS");
    let options = SummaryOptions { global_excludes: false, ..SummaryOptions::default() };
    let (entries, time, peak, work) = match mode.as_str() {
        // `stockade diff --stat`: the summary, with classification, line
        // counts and the conflict check.
        "summary" => {
            let (summary, time, peak, work) = phase(|| Summary::build(&store, &ws, &options).unwrap());
            (summary.items.len(), time, peak, work)
        }
        // `stockade run --apply all`: the summary, then apply.
        "review" => {
            let mut out = Vec::new();
            let (outcome, time, peak, work) = phase(|| {
                let mut console = Console {
                    out: &mut out,
                    answers: None,
                    painter: Painter::plain(),
                    pager: Pager::Off,
                    progress: &mut crate::progress::Silent,
                };
                review::review(&store, &ws, "bench", ApplyMode::All, true, &mut console, &options).unwrap()
            });
            assert_eq!(outcome.not_applied, 0, "{}", String::from_utf8_lossy(&out));
            (outcome.applied, time, peak, work)
        }
        // `stockade apply`: the execution-sensitive check, then apply.
        "apply" => {
            let ((sensitive, report), time, peak, work) = phase(|| {
                let sensitive = review::sensitive_paths(&store, &ws, &Selection::all(), &Default::default()).unwrap();
                (sensitive, apply(&store, &ws, &ApplyOptions::all()).unwrap())
            });
            assert_eq!(report.skipped(), 0, "{report:?}");
            let _ = sensitive;
            (report.applied.len(), time, peak, work)
        }
        other => panic!("unknown STOCKADE_BENCH_MODE {other}"),
    };
    println!(
        "\nRESULT mode={mode} entries={entries} ms={:.1} peak_kib={peak} rss_before_kib={before} \
         export_lower_lookups={} work=\"{}\"",
        time.as_secs_f64() * 1e3,
        report.lower_lookups,
        work_text(&work),
    );
}

/// For comparison: what the review does not do (git over the whole
/// workspace), and the tree digests a removed directory costs.
#[test]
#[ignore = "a benchmark: run benches/review.sh"]
fn review_big_workspace_context() {
    let Some(ws) = std::env::var_os("STOCKADE_BENCH_WORKSPACE").map(PathBuf::from) else {
        println!("set STOCKADE_BENCH_WORKSPACE (benches/review.sh does)");
        return;
    };
    big_workspace(&ws);
    println!();
    let timed = |what: &str, f: &mut dyn FnMut() -> String| {
        let started = Instant::now();
        let note = f();
        println!("{what:<52} {:>9.1} ms  {note}", started.elapsed().as_secs_f64() * 1e3);
    };
    let git = |args: &[&str]| -> String {
        match Command::new("git").args(args).current_dir(&ws).output() {
            Ok(out) => format!("{} lines", out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count()),
            Err(e) => format!("no git: {e}"),
        }
    };
    timed("git status --porcelain (not run by stockade)", &mut || git(&["status", "--porcelain"]));
    timed("git status --porcelain --ignored (not run)", &mut || git(&["status", "--porcelain", "--ignored"]));
    timed("git check-ignore --stdin, 10 paths (not run)", &mut || {
        let mut child = Command::new("git")
            .args(["check-ignore", "--stdin", "--no-index"])
            .current_dir(&ws)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let paths: String = (0..10).map(|i| format!("{}/f{i:04}.js\n", big_dir(i * 100))).collect();
        child.stdin.take().unwrap().write_all(paths.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        format!("{} ignored", out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count())
    });
    let root = fs::File::open(&ws).unwrap();
    timed("tree digest of a removed 1,000-file directory", &mut || {
        let d = tree_digest_at(&fs::File::open(ws.join("node_modules")).unwrap(), b"pkg0001").unwrap();
        format!("{} entries", d.entries)
    });
    timed("tree digest of a removed node_modules/ (900,000)", &mut || {
        let d = tree_digest_at(&root, b"node_modules").unwrap();
        format!("{} entries", d.entries)
    });
}

// Per-entry cost at scale (issue #17), run by `benches/scale.sh`: change sets
// of a million entries, of 4 KiB paths, and of a tree 1,500 levels deep,
// each staged and applied in a process of its own so that `/usr/bin/time -v`
// gives its peak memory. STOCKADE_BENCH_SHAPE picks the set,
// STOCKADE_BENCH_STEP the step (`generate`, `stage`, `apply`),
// STOCKADE_BENCH_DIR where its stream, session and workspace live, and
// STOCKADE_BENCH_NO_CAP=1 lifts the metadata cap to show the cost past it.

/// Writes the change set of `shape` to `out`; returns its entry count.
fn scale_set(shape: &str, out: impl Write) -> u64 {
    use crate::protocol::change_set::entry::Base;
    use crate::protocol::change_set::path::RelPath;
    let mut w = Writer::new(std::io::BufWriter::with_capacity(1 << 20, out)).unwrap();
    let p = |s: &str| RelPath::new(s.as_bytes()).unwrap();
    let content = b"module.exports = 1;\n";
    let mut sha = None;
    let mut file = |w: &mut Writer<_>, path: &RelPath| match sha {
        None => sha = Some(w.file(path, 0o644, content.len() as u64, &mut &content[..], &Base::Absent).unwrap()),
        Some(s) => w.file_again(path, 0o644, &s, &Base::Absent).unwrap(),
    };
    match shape {
        // 1,000 directories of 999 files: 1,000,000 entries, short paths.
        "million" => {
            for d in 0..1000 {
                let dir = p(&format!("node_modules/pkg{d:04}"));
                if d == 0 {
                    w.dir(&p("node_modules"), 0o755, &Base::Absent).unwrap();
                }
                w.dir(&dir, 0o755, &Base::Absent).unwrap();
                for f in 0..(if d == 0 { 998 } else { 999 }) {
                    file(&mut w, &dir.join(format!("file{f:04}.js").as_bytes()).unwrap());
                }
            }
        }
        // 1,000,000 paths of 4 KiB: 16 names of 255 bytes, the first one
        // different for each path (nothing shared).
        "long" => {
            for i in 0..1_000_000u64 {
                let mut path = String::with_capacity(4096);
                for level in 0..16 {
                    if level > 0 {
                        path.push('/');
                    }
                    let name = format!("{i:0>12}{level:0>3}");
                    path.push_str(&name.repeat(17)[..255]);
                }
                w.delete(&p(&path), &Base::Absent).unwrap();
            }
        }
        // A chain of 1,500 directories with 200,000 files spread over its levels.
        "deep" => {
            let mut dir = String::new();
            let mut files = 0u64;
            for level in 0..1500u64 {
                if level > 0 {
                    dir.push('/');
                }
                dir.push('d');
                w.dir(&p(&dir), 0o755, &Base::Absent).unwrap();
                let here = 200_000 / 1500 + u64::from(level < 200_000 % 1500);
                for f in 0..here {
                    file(&mut w, &p(&format!("{dir}/f{f}")));
                    files += 1;
                }
            }
            assert_eq!(files, 200_000);
        }
        // The worst within the caps: paths of 4 KiB that are 2,047 levels
        // deep, as many as the metadata cap allows (65,000), every one
        // resolved through the whole chain when applied.
        "worst" => {
            let mut dir = String::new();
            for level in 0..2040 {
                if level > 0 {
                    dir.push('/');
                }
                dir.push('d');
                w.dir(&p(&dir), 0o755, &Base::Absent).unwrap();
            }
            for f in 0..61_000 {
                file(&mut w, &p(&format!("{dir}/{f:x}")));
            }
        }
        other => panic!("unknown STOCKADE_BENCH_SHAPE {other}"),
    }
    let (mut out, summary) = w.finish().unwrap();
    out.flush().unwrap();
    summary.entries
}

#[test]
#[ignore = "a benchmark: run benches/scale.sh"]
fn scale() {
    let shape = std::env::var("STOCKADE_BENCH_SHAPE").unwrap_or_else(|_| "million".into());
    let step = std::env::var("STOCKADE_BENCH_STEP").unwrap_or_else(|_| "stage".into());
    let base = std::env::var_os("STOCKADE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = base.join(format!("stockade-scale-{shape}"));
    fs::create_dir_all(&dir).unwrap();
    let stream = dir.join("stream");
    let session = dir.join("session");
    let ws = dir.join("ws");
    let mut limits = Limits::default();
    if std::env::var_os("STOCKADE_BENCH_NO_CAP").is_some() {
        limits.max_metadata_bytes = u64::MAX;
    }
    let started = Instant::now();
    let outcome = match step.as_str() {
        "generate" => {
            let entries = scale_set(&shape, fs::File::create(&stream).unwrap());
            let bytes = fs::metadata(&stream).unwrap().len();
            format!("entries={entries} stream_mib={:.1}", bytes as f64 / (1 << 20) as f64)
        }
        "stage" => {
            let _ = fs::remove_dir_all(&session);
            let store = Store::open(&session).unwrap();
            let input = std::io::BufReader::with_capacity(256 << 10, fs::File::open(&stream).unwrap());
            match store.stage(input, limits) {
                Ok(report) => format!("staged entries={}", report.summary.entries),
                Err(e) => format!("refused: {:#}", anyhow::Error::from(e)).replace('\n', " "),
            }
        }
        "apply" => {
            let _ = fs::remove_dir_all(&ws);
            fs::create_dir_all(&ws).unwrap();
            let store = Store::open(&session).unwrap();
            if !store.is_staged() {
                println!("\nRESULT shape={shape} step={step} nothing staged");
                return;
            }
            let report = apply(&store, &ws, &ApplyOptions::all()).unwrap();
            format!("applied={} skipped={}", report.applied.len(), report.skipped())
        }
        other => panic!("unknown STOCKADE_BENCH_STEP {other}"),
    };
    println!(
        "\nRESULT shape={shape} step={step} s={:.2} peak_mib={:.0} {outcome}",
        started.elapsed().as_secs_f64(),
        proc_kib("VmHWM") as f64 / 1024.0
    );
}

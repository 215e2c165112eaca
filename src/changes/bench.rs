//! The change pipeline's benchmark, run by `benches/apply.sh` (an ignored
//! test, so it needs no extra binary): guest export of 10,000 files, staging
//! them and applying them, each the median of a few runs, plus the
//! filesystem's own floor for comparison.
//! Prints numbers; asserts nothing about time.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{ApplyOptions, Limits, Store, Writer, apply};
use crate::guest::export::{Markers, export};

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

//! Attacks on the fork-join pool (`super::pool`): runs of every size on
//! three helpers with tiny jobs, helpers that start late or after the pool
//! is gone, jobs that panic (last, on a helper, with a payload whose drop
//! panics too), very long jobs, two threads running one pool at once, and
//! idle helpers that must sleep rather than spin. Every test runs under a
//! watchdog that fails it rather than hang. A test headed "Found by
//! attack" failed on the pool as it was; the others guard attacks that
//! held.

use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use super::pool::{Job, Pool};

/// Runs `f` on a thread of its own and fails the test if it is not done
/// within `limit`: a hung pool leaves that thread behind, not the test.
fn within<R: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: not done after {limit:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

fn started<T: Send + 'static>(helpers: usize) -> (Pool<T>, Vec<JoinHandle<()>>) {
    let (pool, loops) = Pool::new(helpers);
    (pool, loops.into_iter().map(thread::spawn).collect())
}

/// Joins the helpers, failing if one has not returned within a second or
/// died of a panic.
/// `n` jobs, the `i`th giving `i`, that each wait for all the others: a
/// run of them ends only if `n` threads serve it at once.
fn meeting(n: usize) -> Vec<Job<usize>> {
    let meet = Arc::new(Barrier::new(n));
    (0..n)
        .map(|i| {
            let meet = Arc::clone(&meet);
            Box::new(move || {
                meet.wait();
                i
            }) as Job<usize>
        })
        .collect()
}

fn joined(threads: Vec<JoinHandle<()>>) {
    let died = within(Duration::from_secs(2), "helpers returning after the pool was dropped", move || {
        threads.into_iter().map(JoinHandle::join).filter(Result::is_err).count()
    });
    assert_eq!(died, 0, "a helper died of a panic");
}

fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The CPU time `thread` has used so far; it must still be running.
fn cpu_of(thread: &JoinHandle<()>) -> Duration {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the handle is not joined, so its pthread_t is valid; the call
    // only writes `clock`, which we own.
    assert_eq!(unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) }, 0);
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes into `now`, a valid timespec we own.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut now) }, 0);
    Duration::new(u64::try_from(now.tv_sec).unwrap(), u32::try_from(now.tv_nsec).unwrap())
}

/// How much CPU each of `threads` used over `window`, while the test
/// thread sleeps.
/// After a moment to settle, no helper of `pool` uses more than a tenth of
/// a CPU over 300 ms; then the pool is dropped and its helpers joined.
fn assert_idle_then_stop(pool: Pool<usize>, threads: Vec<JoinHandle<()>>) {
    thread::sleep(Duration::from_millis(20));
    let used = cpu_over(&threads, Duration::from_millis(300));
    drop(pool);
    joined(threads);
    for (i, used) in used.iter().enumerate() {
        assert!(*used < Duration::from_millis(30), "idle helper {i} used {used:?} of CPU in 300ms");
    }
}

fn cpu_over(threads: &[JoinHandle<()>], window: Duration) -> Vec<Duration> {
    let before: Vec<Duration> = threads.iter().map(cpu_of).collect();
    thread::sleep(window);
    threads.iter().zip(before).map(|(t, b)| cpu_of(t).saturating_sub(b)).collect()
}

/// A one-way flag to wait on, with a bound so a job never blocks for ever.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let open = self.open.lock().unwrap();
        let (open, _) = self.opened.wait_timeout_while(open, Duration::from_secs(5), |open| !*open).unwrap();
        assert!(*open, "gate never opened");
    }
}

/// Found by attack: a helper that woke too late for a run (the worker had
/// served it alone and closed it) kept `served` at the run before, so
/// `runs != served` held for ever and it looped on the state lock at full
/// CPU until the next run. Started after runs it never saw, it spins the
/// same way. An idle device must leave its helpers asleep.
#[test]
fn a_helper_started_after_runs_it_never_saw_sleeps_when_idle() {
    let (pool, loops) = Pool::<usize>::new(1);
    for r in 0..3 {
        assert_eq!(pool.run(vec![Box::new(move || r)]).results, [Some(r)]);
    }
    let threads: Vec<JoinHandle<()>> = loops.into_iter().map(thread::spawn).collect();
    assert_idle_then_stop(pool, threads);
}

/// Found by attack (the same fault as above, met in use): one-job runs
/// spaced out like a guest's occasional requests are served by the worker
/// before a sleeping helper wakes; every helper that missed the last run
/// then spins until the next.
#[test]
fn helpers_that_missed_short_runs_sleep_when_idle() {
    let (pool, threads) = started::<usize>(3);
    thread::sleep(Duration::from_millis(20));
    for r in 0..50 {
        assert_eq!(pool.run(vec![Box::new(move || r)]).results, [Some(r)]);
        thread::sleep(Duration::from_millis(1));
    }
    assert_idle_then_stop(pool, threads);
}

/// Helpers watch for a moment after a run they served, then sleep.
#[test]
fn helpers_that_served_a_run_sleep_when_idle() {
    let (pool, threads) = started::<usize>(3);
    let jobs = meeting(4);
    let (pool, ran) = within(Duration::from_secs(5), "a run needing all four threads", move || {
        let ran = pool.run(jobs);
        (pool, ran)
    });
    assert_eq!(ran.results, (0..4).map(Some).collect::<Vec<_>>());
    assert_idle_then_stop(pool, threads);
}

/// Found by attack: `Pool` is `Sync` and `run` takes `&self`, so two
/// threads may run one pool at once; both then wait on `done`, and a
/// helper's `notify_one` for one run's last job could wake the other run's
/// worker, which slept again, while the first's slept for ever. Each run
/// here holds one helper until released; the run whose worker went to
/// sleep last has its helper released first, so its wake-up goes to the
/// other worker (first in the queue); the next wake-up goes to it, and the
/// other is never woken.
#[test]
fn two_threads_running_one_pool_at_once_both_return() {
    struct Started {
        results: mpsc::Receiver<Vec<Option<usize>>>,
        release: Arc<Gate>,
        /// Whether the run's worker ran a job of its own (else it went to
        /// sleep at once).
        worker_ran: Arc<AtomicBool>,
    }
    let (pool, threads) = started::<usize>(2);
    thread::sleep(Duration::from_millis(20));
    let pool = Arc::new(pool);
    // A run of two jobs: the first job on a helper waits for `release`, a
    // second there returns; the one on the worker waits for the one on a
    // helper, then for `worker_delay`.
    let start = |worker_delay: Duration| {
        let pool = Arc::clone(&pool);
        let (tx, results) = mpsc::channel();
        let (on_helper, release) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
        let worker_ran = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let jobs_of = {
            let (on_helper, release, worker_ran) =
                (Arc::clone(&on_helper), Arc::clone(&release), Arc::clone(&worker_ran));
            move |worker: ThreadId| -> Vec<Job<usize>> {
                (0..2usize)
                    .map(|i| {
                        let (on_helper, release) = (Arc::clone(&on_helper), Arc::clone(&release));
                        let (worker_ran, held) = (Arc::clone(&worker_ran), Arc::clone(&held));
                        Box::new(move || {
                            if thread::current().id() == worker {
                                worker_ran.store(true, Ordering::SeqCst);
                                on_helper.wait();
                                thread::sleep(worker_delay);
                            } else if !held.swap(true, Ordering::SeqCst) {
                                on_helper.open();
                                release.wait();
                            }
                            i
                        }) as Job<usize>
                    })
                    .collect()
            }
        };
        thread::spawn(move || {
            let jobs = jobs_of(thread::current().id());
            let _ = tx.send(pool.run(jobs).results);
        });
        on_helper.wait();
        Started { results, release, worker_ran }
    };
    let a = start(Duration::from_millis(40));
    let b = start(Duration::ZERO);
    // Both workers asleep on `done`.
    thread::sleep(Duration::from_millis(100));
    let (first, second) = if a.worker_ran.load(Ordering::SeqCst) { (&a, &b) } else { (&b, &a) };
    first.release.open();
    thread::sleep(Duration::from_millis(50));
    second.release.open();
    let limit = Duration::from_secs(2);
    let results = (a.results.recv_timeout(limit), b.results.recv_timeout(limit));
    assert_eq!(results, (Ok(vec![Some(0), Some(1)]), Ok(vec![Some(0), Some(1)])), "runs A and B");
    drop(pool);
    joined(threads);
}

/// Thousands of runs of 0 to 9 tiny jobs on three helpers: every job runs
/// once, inside its own run (never before `run` is called, never after it
/// returned, never during a later run), and its result lands in its slot.
#[test]
fn tiny_runs_of_every_size_on_three_helpers_run_each_job_once_within_its_run() {
    within(Duration::from_secs(20), "10000 tiny runs", || {
        let (pool, threads) = started::<(usize, usize)>(3);
        // The run under way, 0 between runs.
        let current = Arc::new(AtomicUsize::new(0));
        let strays = Arc::new(AtomicUsize::new(0));
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for r in 1..=10_000usize {
            let size = r % 10;
            let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..size).map(|_| AtomicUsize::new(0)).collect());
            let in_flight = Arc::new(AtomicUsize::new(0));
            let jobs: Vec<Job<(usize, usize)>> = (0..size)
                .map(|i| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let work = Duration::from_nanos((seed >> 33) % 3_000);
                    let (current, strays) = (Arc::clone(&current), Arc::clone(&strays));
                    let (counts, in_flight) = (Arc::clone(&counts), Arc::clone(&in_flight));
                    Box::new(move || {
                        in_flight.fetch_add(1, Ordering::SeqCst);
                        if current.load(Ordering::SeqCst) != r {
                            strays.fetch_add(1, Ordering::SeqCst);
                        }
                        counts[i].fetch_add(1, Ordering::SeqCst);
                        spin(work);
                        if current.load(Ordering::SeqCst) != r {
                            strays.fetch_add(1, Ordering::SeqCst);
                        }
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        (r, i)
                    }) as Job<(usize, usize)>
                })
                .collect();
            current.store(r, Ordering::SeqCst);
            let ran = pool.run(jobs);
            current.store(0, Ordering::SeqCst);
            assert_eq!(in_flight.load(Ordering::SeqCst), 0, "run {r} returned with a job at work");
            let want: Vec<Option<(usize, usize)>> = (0..size).map(|i| Some((r, i))).collect();
            assert_eq!(ran.results, want, "run {r}");
            for (i, count) in counts.iter().enumerate() {
                assert_eq!(count.load(Ordering::SeqCst), 1, "job {i} of run {r}");
            }
        }
        thread::sleep(Duration::from_millis(5));
        assert_eq!(strays.load(Ordering::SeqCst), 0, "jobs ran outside their run");
        drop(pool);
        joined(threads);
    });
}

/// Jobs that panic on a helper, after the worker has done its own, so a
/// panicking job is each run's last: the run still returns, with no result
/// for exactly those jobs, and the helpers serve the next run.
#[test]
fn panics_in_the_last_jobs_on_helpers_leave_the_runs_whole() {
    within(Duration::from_secs(10), "runs whose last jobs panic on helpers", || {
        let (pool, threads) = started::<usize>(3);
        let mut on_helpers = 0;
        for _ in 0..30 {
            let worker = thread::current().id();
            let helped: Arc<Vec<AtomicBool>> = Arc::new((0..6).map(|_| AtomicBool::new(false)).collect());
            let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..6).map(|_| AtomicUsize::new(0)).collect());
            let jobs: Vec<Job<usize>> = (0..6usize)
                .map(|i| {
                    let (helped, counts) = (Arc::clone(&helped), Arc::clone(&counts));
                    Box::new(move || {
                        counts[i].fetch_add(1, Ordering::SeqCst);
                        if thread::current().id() == worker {
                            spin(Duration::from_micros(200));
                            return i;
                        }
                        helped[i].store(true, Ordering::SeqCst);
                        spin(Duration::from_millis(1));
                        panic!("job {i} fails on a helper");
                    }) as Job<usize>
                })
                .collect();
            let ran = pool.run(jobs);
            for i in 0..6 {
                assert_eq!(counts[i].load(Ordering::SeqCst), 1, "job {i} ran once");
                let helped = helped[i].load(Ordering::SeqCst);
                on_helpers += usize::from(helped);
                assert_eq!(ran.results[i], Some(i).filter(|_| !helped), "job {i}");
            }
        }
        assert!(on_helpers > 0, "no job ever ran on a helper");
        let jobs = meeting(2);
        assert_eq!(pool.run(jobs).results, [Some(0), Some(1)]);
        drop(pool);
        joined(threads);
    });
}

/// A panic payload whose own drop panics.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload's drop panics");
    }
}

/// Found by attack: `run_one` dropped a panic's payload outside
/// `catch_unwind`; a payload whose drop panics too unwound out of the
/// helper's loop, so the helper died with its job never counted done and
/// the worker waited for it for ever (on the worker, `run` unwound with the
/// run still open to the helpers).
#[test]
fn a_panic_whose_payload_panics_on_drop_fails_its_job_alone() {
    let (pool, threads) = started::<usize>(1);
    thread::sleep(Duration::from_millis(20));
    let on_helper = Arc::new(Gate::default());
    let held = Arc::new(AtomicBool::new(false));
    let (pool, ran) = within(Duration::from_secs(3), "a run whose helper's job panics twice", move || {
        let worker = thread::current().id();
        let jobs: Vec<Job<usize>> = (0..2usize)
            .map(|i| {
                let (on_helper, held) = (Arc::clone(&on_helper), Arc::clone(&held));
                Box::new(move || {
                    if thread::current().id() == worker {
                        on_helper.wait();
                        return i;
                    }
                    if held.swap(true, Ordering::SeqCst) {
                        return i;
                    }
                    on_helper.open();
                    std::panic::panic_any(Bomb);
                }) as Job<usize>
            })
            .collect();
        let ran = pool.run(jobs).results;
        (pool, ran)
    });
    assert_eq!(ran.iter().filter(|r| r.is_none()).count(), 1, "{ran:?}");
    // The helper still serves.
    let jobs = meeting(2);
    let (pool, ran) = within(Duration::from_secs(3), "the next run, needing the helper", move || {
        let ran = pool.run(jobs).results;
        (pool, ran)
    });
    assert_eq!(ran, [Some(0), Some(1)]);
    drop(pool);
    joined(threads);
}

/// A job far longer than the helpers' watch: the worker sleeps until it is
/// done, and its result is in place.
#[test]
fn a_very_long_job_on_a_helper_is_waited_for() {
    let (pool, threads) = started::<usize>(1);
    let on_helper = Arc::new(Gate::default());
    let (pool, ran, took) = within(Duration::from_secs(5), "a run with a 300ms job", move || {
        let worker = thread::current().id();
        let jobs: Vec<Job<usize>> = (0..2usize)
            .map(|i| {
                let on_helper = Arc::clone(&on_helper);
                Box::new(move || {
                    if thread::current().id() == worker {
                        on_helper.wait();
                    } else {
                        on_helper.open();
                        thread::sleep(Duration::from_millis(300));
                    }
                    i + 40
                }) as Job<usize>
            })
            .collect();
        let start = Instant::now();
        let ran = pool.run(jobs);
        (pool, ran, start.elapsed())
    });
    assert_eq!(ran.results, [Some(40), Some(41)]);
    assert!(took >= Duration::from_millis(300), "run returned after {took:?}");
    assert!(ran.helper_cpu < Duration::from_millis(100), "the helper slept: {:?}", ran.helper_cpu);
    drop(pool);
    joined(threads);
}

/// Helpers started only after many runs join the next one (two jobs that
/// meet need two threads).
#[test]
fn helpers_started_late_serve_the_next_run() {
    let (pool, loops) = Pool::<usize>::new(2);
    for r in 0..100 {
        assert_eq!(pool.run((0..r % 4).map(|i| Box::new(move || i) as Job<usize>).collect()).results.len(), r % 4);
    }
    let threads: Vec<JoinHandle<()>> = loops.into_iter().map(thread::spawn).collect();
    let jobs = meeting(3);
    let (pool, ran) = within(Duration::from_secs(3), "a run needing both late helpers", move || {
        let ran = pool.run(jobs).results;
        (pool, ran)
    });
    assert_eq!(ran, [Some(0), Some(1), Some(2)]);
    drop(pool);
    joined(threads);
}

/// Dropping the pool ends its helpers whatever they were at: never served,
/// watching just after a run, asleep after one, started after the drop, or
/// spinning after a run they missed.
#[test]
fn helpers_return_once_the_pool_is_dropped_whatever_they_were_doing() {
    for round in 0..50 {
        let (pool, loops) = Pool::<usize>::new(3);
        let threads: Vec<JoinHandle<()>> = if round % 5 == 3 {
            drop(pool);
            loops.into_iter().map(thread::spawn).collect()
        } else {
            let late = round % 5 == 4;
            let (loops, later) = if late { (Vec::new(), loops) } else { (loops, Vec::new()) };
            let mut threads: Vec<JoinHandle<()>> = loops.into_iter().map(thread::spawn).collect();
            if round % 5 >= 1 {
                let ran = pool.run((0..8usize).map(|i| Box::new(move || i) as Job<usize>).collect());
                assert_eq!(ran.results, (0..8).map(Some).collect::<Vec<_>>());
            }
            threads.extend(later.into_iter().map(thread::spawn));
            if round % 5 == 2 {
                thread::sleep(Duration::from_millis(2));
            }
            drop(pool);
            threads
        };
        joined(threads);
    }
}

/// Across many runs nothing is kept: each job and what it captured is
/// dropped by the time `run` returns (a job that panicked too), and every
/// result is handed back exactly once.
#[test]
fn runs_keep_nothing_of_their_jobs_or_results() {
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    within(Duration::from_secs(10), "2000 runs counting drops", || {
        let (pool, threads) = started::<Counted>(3);
        let captured = Arc::new(());
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut made = 0;
        for r in 0..2000usize {
            let size = r % 7;
            let jobs: Vec<Job<Counted>> = (0..size)
                .map(|i| {
                    let captured = Arc::clone(&captured);
                    let dropped = Arc::clone(&dropped);
                    Box::new(move || {
                        let _keep = &captured;
                        assert!(i != 5, "job 5 fails");
                        Counted(dropped)
                    }) as Job<Counted>
                })
                .collect();
            made += size.min(5);
            let ran = pool.run(jobs);
            assert_eq!(Arc::strong_count(&captured), 1, "run {r} returned with a job kept");
            assert_eq!(ran.results.iter().filter(|r| r.is_some()).count(), size.min(5));
        }
        assert_eq!(dropped.load(Ordering::SeqCst), made, "results dropped");
        drop(pool);
        joined(threads);
    });
}

/// Which threads ran a run's jobs: the worker (the caller) and, with jobs
/// long enough, the helpers, never any other thread.
#[test]
fn only_the_worker_and_its_helpers_run_jobs() {
    within(Duration::from_secs(10), "runs recording their threads", || {
        let (pool, threads) = started::<ThreadId>(3);
        let mut allowed: Vec<ThreadId> = threads.iter().map(|t| t.thread().id()).collect();
        allowed.push(thread::current().id());
        let mut seen = Vec::new();
        for _ in 0..200 {
            let jobs: Vec<Job<ThreadId>> = (0..8)
                .map(|_| {
                    Box::new(|| {
                        spin(Duration::from_micros(20));
                        thread::current().id()
                    }) as Job<ThreadId>
                })
                .collect();
            for id in pool.run(jobs).results {
                let id = id.expect("no job panics");
                assert!(allowed.contains(&id), "a job ran on {id:?}");
                if !seen.contains(&id) {
                    seen.push(id);
                }
            }
        }
        assert!(seen.len() > 1, "the helpers never ran a job");
        drop(pool);
        joined(threads);
    });
}

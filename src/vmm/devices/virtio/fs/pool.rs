//! Helper threads that serve a read-only device's requests beside its
//! worker, fork and join once per notification: the worker hands
//! `Pool::run` every request the guest sent at once as a job, serves jobs
//! from the same queue itself, and returns only once every job is done.
//! The jobs own what they use (the server and guest memory are shared
//! handles), and only the worker touches the virtqueue: it puts the
//! replies on the used ring after `run`.
//!
//! Helpers touch guest memory only inside a job, and every job ends before
//! `run` returns, while the worker is still inside its event handler.
//! Recording a template parks each worker between two events (the gate in
//! `worker`), so no helper is at work either while the VM is saved,
//! without the helpers knowing of the gate.
//!
//! Between runs a helper, and the worker waiting for a helper's last job,
//! watch for a moment (`WATCH`) before they sleep: waking a sleeping
//! thread cost more than the jobs of a run gained from it.
//!
//! A run's jobs are claimed by index from one counter and each result has
//! a slot of its own: the threads share no lock per job, only the run's
//! counters (a lock word bounced between two CPUs on every job cost as much
//! as the second CPU gained).
//!
//! A job that panics leaves its result empty and its thread serving. The
//! worker waits only for jobs a helper has taken, never for a helper to
//! wake: one that never started or never wakes leaves its jobs to the
//! worker.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::tally::thread_cpu_time;

/// One piece of work, run once on whichever thread takes it.
pub(super) type Job<T> = Box<dyn FnOnce() -> T + Send + 'static>;

/// A helper thread's whole life, for the device to start beside its
/// worker (see `worker::spawn_with_helpers`); it returns once the pool is
/// dropped.
pub(super) type Helper = Box<dyn FnOnce() + Send + 'static>;

/// The worker's side of the pool.
pub(super) struct Pool<T> {
    shared: Arc<Shared<T>>,
    helpers: usize,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// A run started, or the pool closed: wakes the helpers.
    work: Condvar,
    /// A run's last job is done: wakes the worker.
    done: Condvar,
    /// Runs started so far: a helper that has just run out of jobs
    /// watches it for a moment before it sleeps.
    runs: AtomicUsize,
}

struct State<T> {
    /// The run being served, with its number among `runs`.
    run: Option<(usize, Arc<Run<T>>)>,
    closed: bool,
}

/// One run's jobs, each taken by the thread that claims its index.
struct Run<T> {
    jobs: Vec<Mutex<Option<Job<T>>>>,
    results: Vec<Mutex<Option<T>>>,
    /// The next index to claim.
    next: AtomicUsize,
    /// Jobs not yet done.
    unfinished: AtomicUsize,
    /// The CPU time helpers spent on this run's jobs, in nanoseconds.
    helper_cpu_ns: AtomicU64,
}

impl<T> Run<T> {
    /// Claims and runs jobs until none is left to claim, and calls `last`
    /// if this thread finished the run's last job. `ran_one` is told after
    /// each job, before the job counts as done.
    fn serve(&self, mut ran_one: impl FnMut(&Self), last: impl FnOnce()) {
        loop {
            let index = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(slot) = self.jobs.get(index) else { return };
            let result = lock(slot).take().and_then(run_one);
            *lock(&self.results[index]) = result;
            ran_one(self);
            if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
                last();
                return;
            }
        }
    }
}

/// What a run gave back.
pub(super) struct Ran<T> {
    /// Each job's result, in the order the jobs came; `None` for a job that
    /// panicked.
    pub results: Vec<Option<T>>,
    /// The CPU time the helpers spent on the run's jobs (the worker's own
    /// is its thread's).
    pub helper_cpu: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T: Send + 'static> Pool<T> {
    /// A pool whose worker is helped by `helpers` threads, and those
    /// threads' loops for the caller to start. With none, `run` serves
    /// every job on the calling thread.
    pub(super) fn new(helpers: usize) -> (Pool<T>, Vec<Helper>) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { run: None, closed: false }),
            work: Condvar::new(),
            done: Condvar::new(),
            runs: AtomicUsize::new(0),
        });
        let loops = (0..helpers)
            .map(|_| {
                let shared = Arc::clone(&shared);
                Box::new(move || help(&shared)) as Helper
            })
            .collect();
        (Pool { shared, helpers }, loops)
    }

    /// A pool without helpers.
    #[cfg(test)]
    pub(super) fn serial() -> Pool<T> {
        Pool::new(0).0
    }

    /// How many helpers the pool was made with.
    pub(super) fn helpers(&self) -> usize {
        self.helpers
    }

    /// Runs every job, on this thread and the helpers, and returns once all
    /// are done.
    pub(super) fn run(&self, jobs: Vec<Job<T>>) -> Ran<T> {
        let shared = &*self.shared;
        let run = Arc::new(Run {
            results: jobs.iter().map(|_| Mutex::new(None)).collect(),
            unfinished: AtomicUsize::new(jobs.len()),
            jobs: jobs.into_iter().map(|job| Mutex::new(Some(job))).collect(),
            next: AtomicUsize::new(0),
            helper_cpu_ns: AtomicU64::new(0),
        });
        if run.jobs.is_empty() {
            return Ran { results: Vec::new(), helper_cpu: Duration::ZERO };
        }
        if self.helpers > 0 {
            let number = shared.runs.load(Ordering::Relaxed) + 1;
            lock(&shared.state).run = Some((number, Arc::clone(&run)));
            shared.runs.store(number, Ordering::Release);
            shared.work.notify_all();
        }
        // The last job done here needs nobody woken.
        run.serve(|_| {}, || {});
        if run.unfinished.load(Ordering::Acquire) > 0 {
            watch(|| run.unfinished.load(Ordering::Acquire) == 0);
            let mut state = lock(&shared.state);
            while run.unfinished.load(Ordering::Acquire) > 0 {
                state = shared.done.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
        }
        lock(&shared.state).run = None;
        Ran {
            results: run.results.iter().map(|slot| lock(slot).take()).collect(),
            helper_cpu: Duration::from_nanos(run.helper_cpu_ns.load(Ordering::Acquire)),
        }
    }
}

impl<T> Drop for Pool<T> {
    /// Lets the helpers return.
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.work.notify_all();
    }
}

/// A helper's loop: serves each run it finds, then waits for the next.
fn help<T>(shared: &Shared<T>) {
    let mut seen = 0;
    let mut state = lock(&shared.state);
    loop {
        if state.closed {
            return;
        }
        let next = state.run.as_ref().filter(|(number, _)| *number != seen).map(|(n, run)| (*n, Arc::clone(run)));
        if let Some((number, run)) = next {
            drop(state);
            seen = number;
            let mut before = thread_cpu_time();
            // Counted before the job counts as done, so before the worker
            // can see the run done.
            let count = |run: &Run<T>| {
                let now = thread_cpu_time();
                let spent = u64::try_from(now.saturating_sub(before).as_nanos()).unwrap_or(u64::MAX);
                run.helper_cpu_ns.fetch_add(spent, Ordering::AcqRel);
                before = now;
            };
            // Under the lock the worker checks the count in before it
            // sleeps: it cannot miss this. All are woken: `run` takes
            // `&self`, so two threads may wait, each for its own run.
            let wake = || {
                drop(lock(&shared.state));
                shared.done.notify_all();
            };
            run.serve(count, wake);
            state = lock(&shared.state);
            continue;
        }
        // A run that ended before this helper looked is seen too: else
        // `runs` would differ from `seen` until the next run, and the
        // helper would spin. `runs` counts a run only once it is in
        // `state`, so with none there it counts only runs that ended.
        if state.run.is_none() {
            seen = shared.runs.load(Ordering::Acquire);
        }
        drop(state);
        let woken = watch(|| shared.runs.load(Ordering::Acquire) != seen);
        state = lock(&shared.state);
        let waiting = state.run.as_ref().is_none_or(|(number, _)| *number == seen);
        if !woken && waiting && !state.closed {
            state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// How long a thread of the pool watches for what it waits for before it
/// sleeps: a sleeping thread takes tens of microseconds to wake (more
/// where the host's own CPUs are virtual), a job a few.
const WATCH: Duration = Duration::from_micros(50);

/// Whether `ready` became true within `WATCH`, looking again and again.
fn watch(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= WATCH {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// `job`'s result, or `None` if it panicked.
fn run_one<T>(job: Job<T>) -> Option<T> {
    catch_unwind(AssertUnwindSafe(job)).map_err(drop_payload).ok()
}

/// Drops a panic's payload, whose own drop may panic: that must not unwind
/// out of the loop that serves the run, leaving its job never done.
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(|| drop(payload))) {
        std::mem::forget(again);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread::JoinHandle;
    use std::time::Instant;

    use super::*;

    fn started<T: Send + 'static>(helpers: usize) -> (Pool<T>, Vec<JoinHandle<()>>) {
        let (pool, loops) = Pool::new(helpers);
        (pool, loops.into_iter().map(std::thread::spawn).collect())
    }

    fn spin(d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    /// Every job's result comes back in its place, the helpers serve some
    /// (two jobs that each wait for the other meet only on two threads),
    /// their CPU time is counted, and dropping the pool ends them.
    #[test]
    fn jobs_run_on_the_worker_and_the_helpers_and_come_back_in_order() {
        let (pool, threads) = started::<usize>(2);
        assert_eq!(pool.helpers(), 2);
        for _ in 0..20 {
            let meet = Arc::new(Barrier::new(2));
            let jobs: Vec<Job<usize>> = (0..64usize)
                .map(|i| {
                    let meet = Arc::clone(&meet);
                    Box::new(move || {
                        if i < 2 {
                            meet.wait();
                            spin(Duration::from_millis(2));
                        }
                        i * 10
                    }) as Job<usize>
                })
                .collect();
            let ran = pool.run(jobs);
            let want: Vec<Option<usize>> = (0..64).map(|i| Some(i * 10)).collect();
            assert_eq!(ran.results, want);
            assert!(ran.helper_cpu > Duration::ZERO, "a helper spun for one of the jobs");
        }
        drop(pool);
        for thread in threads {
            thread.join().unwrap();
        }
    }

    /// A job that panics has no result; the others have theirs, and the
    /// pool serves the next run in full.
    #[test]
    fn a_panicking_job_fails_alone() {
        let (pool, threads) = started::<usize>(1);
        let ran_on = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let jobs: Vec<Job<usize>> = (0..16usize)
                .map(|i| {
                    let ran_on = Arc::clone(&ran_on);
                    Box::new(move || {
                        ran_on.fetch_add(1, Ordering::Relaxed);
                        assert!(i % 5 != 3, "job {i} fails");
                        i
                    }) as Job<usize>
                })
                .collect();
            let ran = pool.run(jobs);
            let want: Vec<Option<usize>> = (0..16).map(|i| Some(i).filter(|i| i % 5 != 3)).collect();
            assert_eq!(ran.results, want);
        }
        assert_eq!(ran_on.load(Ordering::Relaxed), 32, "every job ran once");
        drop(pool);
        for thread in threads {
            thread.join().unwrap();
        }
    }

    /// Helpers that never start leave every job to the worker.
    #[test]
    fn the_worker_serves_alone_without_its_helpers() {
        let (pool, loops) = Pool::<u8>::new(3);
        drop(loops);
        let ran = pool.run((0..8u8).map(|i| Box::new(move || i) as Job<u8>).collect());
        assert_eq!(ran.results, (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(ran.helper_cpu, Duration::ZERO);
        let serial = Pool::<u8>::serial();
        assert_eq!(serial.helpers(), 0);
        assert_eq!(serial.run(vec![Box::new(|| 7)]).results, [Some(7)]);
        assert!(serial.run(Vec::new()).results.is_empty());
    }
}

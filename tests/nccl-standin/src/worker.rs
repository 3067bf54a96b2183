//! The process' single "stream": one worker thread executes launched work in order, so enqueue and
//! completion differ as on a GPU. `ncclTestbedSynchronize` waits for it.

use crate::exec::run_job;
use crate::task::Job;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

struct Stream {
    q: Mutex<(VecDeque<Job>, u64, u64)>, // queue, submitted, completed
    cv: Condvar,
}

fn stream() -> &'static Stream {
    static S: OnceLock<Stream> = OnceLock::new();
    S.get_or_init(|| {
        std::thread::Builder::new()
            .name("nccl-stream".into())
            .spawn(worker_loop)
            .expect("spawn stream worker");
        Stream {
            q: Mutex::new((VecDeque::new(), 0, 0)),
            cv: Condvar::new(),
        }
    })
}

fn worker_loop() {
    let s = stream();
    loop {
        let (job, woke) = {
            let mut g = s.q.lock().unwrap_or_else(|e| e.into_inner());
            let mut woke = false;
            loop {
                if let Some(j) = g.0.pop_front() {
                    break (j, woke);
                }
                woke = true;
                g = s.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        };
        let comm = job.comm.clone();
        comm.busy.store(true, Ordering::SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_job(job, woke)));
        if r.is_err() {
            crate::log::warn("stand-in stream: a job panicked; its results are undefined");
        }
        let g = s.q.lock().unwrap_or_else(|e| e.into_inner());
        let idle = g.0.is_empty();
        drop(g);
        if idle && !comm.is_aborted() && comm.pending.load(Ordering::SeqCst) > 0 {
            crate::exec::proxy_ctrl(comm.ctx(), &[(13, 0)]); // Idle
        }
        comm.busy.store(false, Ordering::SeqCst);
        comm.pending.fetch_sub(1, Ordering::SeqCst);
        let mut g = s.q.lock().unwrap_or_else(|e| e.into_inner());
        g.2 += 1;
        drop(g);
        s.cv.notify_all();
    }
}

/// Enqueues a job (the kernel launch).
pub fn submit(job: Job) {
    let s = stream();
    job.comm.pending.fetch_add(1, Ordering::SeqCst);
    let mut g = s.q.lock().unwrap_or_else(|e| e.into_inner());
    g.0.push_back(job);
    g.1 += 1;
    drop(g);
    s.cv.notify_all();
}

/// Waits until everything submitted so far has finished.
pub fn synchronize() {
    let s = stream();
    let mut g = s.q.lock().unwrap_or_else(|e| e.into_inner());
    let target = g.1;
    while g.2 < target {
        g = s.cv.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

/// (jobs submitted, jobs completed) so far: a point recorded on the stream at submitted count
/// `n` has passed once completed >= `n` (the HCCL stand-in's `aclrtRecordEvent`).
pub fn position() -> (u64, u64) {
    let s = stream();
    let g = s.q.lock().unwrap_or_else(|e| e.into_inner());
    (g.1, g.2)
}

/// Waits (bounded) for the next completion.
pub fn wait_progress() {
    let s = stream();
    let g = s.q.lock().unwrap_or_else(|e| e.into_inner());
    let _ = s.cv.wait_timeout(g, Duration::from_millis(20));
}

//! Cost of the eBPF host probes (issue 19) on the traced process, in one run:
//!
//! * **uprobes**: a tight loop calling `ibv_fork_init` of the real `libibverbs.so.1` (dlopen'ed;
//!   after its first call it returns at once) with no probes, with the verbs probes attached but
//!   this process not tracked (what every other process using libibverbs pays), and with this
//!   process tracked. One call = one hit = the entry uprobe and the return uprobe, one ring
//!   record. The ring buffer is drained between timed chunks (outside the timing), as the agent
//!   drains it, so no record is lost.
//! * **sched**: two threads of this process pinned to one CPU ping-pong one byte through two
//!   pipes (each round trip: two context switches, two wakeups), with no probes, with the
//!   scheduler tracepoints attached but this process not tracked (they run on every context
//!   switch of the machine), and tracked. A sched event is one count of the programs' `sched`
//!   counter (a switch between two tracked threads counts twice: switched out, switched in).
//!
//! Every loop is timed by the process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`, all threads), not the
//! wall clock: the probes' cost is CPU time spent in this process's context (the uprobe traps,
//! the tracepoints in its context switches and wakeups), and on a shared machine the wall clock
//! also counts the other processes' turns on the CPU. After the criterion arms, the same three
//! arms run again interleaved (rounds of one batch each, back to back) and the per-round
//! differences are reported too: the machine's drift cancels in them.
//!
//! The setup checks, with the probes' own counters, that the probes fire (every call is a hit;
//! round trips count sched events), so the bench cannot silently measure nothing. At the end it
//! prints the medians (of criterion's samples, as criterion computes them), the per-hit and
//! per-event cost and the ratios. Without root or without the BPF object built in
//! (`COMMINSIGHT_BPF_OBJECT`, `cfg(comminsight_bpf)`) it says why and does nothing.
//!
//! `cargo bench -p comminsight-agent --bench probes` (1 s warm-up, 3 s measurement per arm).

#[cfg(comminsight_bpf)]
fn main() {
    bpf::main();
}

#[cfg(not(comminsight_bpf))]
fn main() {
    println!(
        "probes bench skipped: eBPF not built in (build with COMMINSIGHT_BPF_OBJECT set, after \
         `cargo xtask build-ebpf`)"
    );
}

#[cfg(comminsight_bpf)]
mod bpf {
    use std::cell::RefCell;
    use std::ffi::CStr;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use comminsight_agent::probes::{HostProbes, ProbesConfig};
    use criterion::Criterion;

    /// Calls per timed chunk; the ring (1 MiB, ~170 bytes a record) is drained between chunks.
    const CHUNK: u64 = 1024;
    /// Criterion samples per arm (the medians are over the last `SAMPLES` of each arm).
    const SAMPLES: usize = 50;

    /// `(iterations, elapsed)` of every call of an arm's routine (warm-up first, then the
    /// samples).
    type Samples = Rc<RefCell<Vec<(u64, Duration)>>>;

    pub fn main() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!(
                "probes bench skipped: not root (loading BPF programs needs root or CAP_BPF + \
                 CAP_PERFMON)"
            );
            return;
        }
        let mut c = Criterion::default()
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .sample_size(SAMPLES)
            .configure_from_args();
        check_foreign();
        let uprobe = uprobes(&mut c);
        check_foreign();
        let sched = sched(&mut c);
        check_foreign();
        c.final_summary();
        if let Some((u, i)) = uprobe {
            u.print("uprobe: ibv_fork_init", "hit");
            i.print("uprobe: ibv_fork_init", "hit");
        }
        if let Some((s, i)) = sched {
            s.print("sched: pipe round trip", "sched event");
            i.print("sched: pipe round trip", "sched event");
        }
        let foreign = FOREIGN.with(|s| s.borrow().clone());
        if foreign.is_empty() {
            println!("no other process held BPF programs at the checks (each arm and round)");
        } else {
            println!(
                "WARNING: other processes held BPF programs during the run (their probes fire \
                 here too; rerun when they are gone):"
            );
            for f in foreign {
                println!("  {f}");
            }
        }
    }

    /// The three arms of one measurement and how many probe counts one iteration makes.
    struct Arms {
        off: Samples,
        untracked: Samples,
        tracked: Samples,
        /// Probe counts over the tracked arm's iterations.
        counts_per_iter: f64,
    }

    fn samples() -> Samples {
        Rc::new(RefCell::new(Vec::new()))
    }

    /// Median ns per iteration over the last `SAMPLES` calls (criterion's samples).
    fn median_ns(s: &Samples) -> Option<f64> {
        let s = s.borrow();
        let tail = &s[s.len().saturating_sub(SAMPLES)..];
        let mut v: Vec<f64> = tail
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, d)| d.as_nanos() as f64 / *n as f64)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        Some(if v.len() % 2 == 1 {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        })
    }

    impl Arms {
        fn print(&self, what: &str, unit: &str) {
            let (Some(off), Some(untracked), Some(tracked)) = (
                median_ns(&self.off),
                median_ns(&self.untracked),
                median_ns(&self.tracked),
            ) else {
                println!("{what}: not every arm ran (filtered?); no comparison");
                return;
            };
            let k = self.counts_per_iter;
            println!(
                "{what} (criterion: medians of {SAMPLES} samples, process CPU ns per iteration):"
            );
            println!("  no probes:                 {off:10.1}");
            println!(
                "  attached, pid not tracked: {untracked:10.1}  ({:.2}x, +{:.1} ns)",
                untracked / off,
                untracked - off
            );
            println!(
                "  attached, pid tracked:     {tracked:10.1}  ({:.2}x, +{:.1} ns)",
                tracked / off,
                tracked - off
            );
            println!("  probe counts per iteration (tracked): {k:.3}");
            if k > 0.0 {
                println!(
                    "  cost per {unit}: tracked {:.1} ns, untracked {:.1} ns (difference / {k:.3})",
                    (tracked - off) / k,
                    (untracked - off) / k
                );
            }
        }
    }

    /// The three probe states an arm runs under.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Arm {
        Off,
        Untracked,
        Tracked,
    }

    /// The arms again, outside criterion: rounds of one fixed batch per arm, the arms
    /// of a round back to back (forward, then backward order, so no arm always runs first), so
    /// the machine's drift cancels in each round's differences.
    struct Interleaved {
        /// ns per iteration of each round, per arm (`Arm as usize`).
        per_round: [Vec<f64>; 3],
        /// Probe counts per iteration over the tracked batches.
        counts_per_iter: f64,
        /// Median time of `HostProbes::start` (ms).
        start_ms: f64,
    }

    /// Pause after a change of the probes' state, before its arm's batch.
    const SETTLE: Duration = Duration::from_millis(30);

    fn median(mut v: Vec<f64>) -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        if v.len() % 2 == 1 {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        }
    }

    /// Run `batch` (`iters` iterations under the probes given, timed) for every arm of every
    /// round; `counter` is the probe counter whose hits the tracked batches count.
    fn interleave(
        start: impl Fn() -> Option<HostProbes>,
        rounds: usize,
        iters: u64,
        counter: &str,
        mut batch: impl FnMut(Option<&mut HostProbes>, u64) -> Duration,
    ) -> Option<Interleaved> {
        let pid = std::process::id();
        let mut probes: Option<HostProbes> = None;
        let mut tracked = false;
        let mut per_round: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let (mut hit_iters, mut hit_count) = (0u64, 0u64);
        let mut starts = Vec::new();
        for round in 0..rounds {
            check_foreign();
            let mut order = [Arm::Off, Arm::Untracked, Arm::Tracked];
            if round % 2 == 1 {
                order.reverse();
            }
            for arm in order {
                let was = (probes.is_some(), tracked);
                match arm {
                    Arm::Off => {
                        probes = None;
                        tracked = false;
                    }
                    Arm::Untracked | Arm::Tracked => {
                        if probes.is_none() {
                            let t = Instant::now();
                            probes = Some(start()?);
                            starts.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                        let p = probes.as_mut().expect("started");
                        let want = arm == Arm::Tracked;
                        if want && !tracked {
                            p.track(pid).expect("track the bench's own pid");
                        } else if !want && tracked {
                            p.untrack(pid).expect("untrack the bench's own pid");
                        }
                        tracked = want;
                    }
                }
                if was != (probes.is_some(), tracked) {
                    // Let the kernel's deferred work of a start, a drop (maps and links freed)
                    // or a map update finish off the timed batch, then warm up.
                    std::thread::sleep(SETTLE);
                    batch(probes.as_mut(), iters / 4);
                }
                let h0 = probes.as_ref().map_or(0, |p| hits(p, counter));
                let d = batch(probes.as_mut(), iters);
                if arm == Arm::Tracked {
                    let p = probes.as_ref().expect("started");
                    hit_iters += iters;
                    hit_count += hits(p, counter) - h0;
                }
                per_round[arm as usize].push(d.as_nanos() as f64 / iters as f64);
            }
        }
        Some(Interleaved {
            per_round,
            counts_per_iter: hit_count as f64 / hit_iters.max(1) as f64,
            start_ms: median(starts),
        })
    }

    impl Interleaved {
        fn print(&self, what: &str, unit: &str) {
            let [off, un, tr] = &self.per_round;
            let k = self.counts_per_iter;
            let diff = |a: &[f64]| median(a.iter().zip(off).map(|(x, o)| x - o).collect());
            let (d_un, d_tr) = (diff(un), diff(tr));
            let ratio = |a: &[f64]| median(a.iter().zip(off).map(|(x, o)| x / o).collect());
            println!(
                "{what}, interleaved ({} rounds of the three arms back to back; medians \
                 of process CPU ns per iteration, and of each round's difference to no probes):",
                off.len()
            );
            println!("  no probes:                 {:10.1}", median(off.clone()));
            println!(
                "  attached, pid not tracked: {:10.1}  (paired: {:.2}x, +{d_un:.1} ns)",
                median(un.clone()),
                ratio(un)
            );
            println!(
                "  attached, pid tracked:     {:10.1}  (paired: {:.2}x, +{d_tr:.1} ns)",
                median(tr.clone()),
                ratio(tr)
            );
            println!(
                "  probe counts per iteration (tracked): {k:.3}; HostProbes::start median {:.1} ms",
                self.start_ms
            );
            if k > 0.0 {
                println!(
                    "  cost per {unit} (paired): tracked {:.1} ns, untracked {:.1} ns",
                    d_tr / k,
                    d_un / k
                );
            }
            if std::env::var_os("PROBES_BENCH_RAW").is_some() {
                for (i, ((o, u), t)) in off.iter().zip(un).zip(tr).enumerate() {
                    println!("  round {i:2}: off {o:8.1}  untracked {u:8.1}  tracked {t:8.1}");
                }
            }
        }
    }

    /// CPU time of this process so far (all threads, user and system): what the loops are timed
    /// by, so the time this shared machine's other processes take on the CPU is not counted.
    fn cpu_now() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime fills one valid timespec.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Other processes holding BPF programs (`pid cmdline`): their uprobes on libibverbs (with
    /// `UProbeScope::AllProcesses`) and tracepoints run in this process too and spoil the
    /// "no probes" arm, so the summary names them.
    fn foreign_bpf() -> Vec<String> {
        let me = std::process::id().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == me || !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let holds = std::fs::read_dir(e.path().join("fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|t| t.to_string_lossy().contains("bpf-prog"))
                });
            if holds {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                out.push(format!("{name} {}", cmd.trim()));
            }
        }
        out
    }

    thread_local! {
        /// Every other BPF user seen during the run.
        static FOREIGN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    /// Note the other BPF users now.
    fn check_foreign() {
        let f = foreign_bpf();
        FOREIGN.with(|s| {
            let mut s = s.borrow_mut();
            for x in f {
                if !s.contains(&x) {
                    s.push(x);
                }
            }
        });
    }

    /// The hits of probe counter `name` so far.
    fn hits(p: &HostProbes, name: &str) -> u64 {
        p.counts()
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.hits)
    }

    /// Start the probes of `cfg`; `None` (and why) when the ones named `need` did not attach.
    fn start(cfg: &ProbesConfig, need: &str) -> Option<HostProbes> {
        check_foreign();
        let p = match HostProbes::start(cfg, false) {
            Ok(p) => p,
            Err(e) => {
                println!("probes bench: {need} skipped: {e}");
                return None;
            }
        };
        let bad: Vec<String> = p
            .statuses()
            .iter()
            .filter(|s| s.name.starts_with(need) && !s.ok)
            .map(|s| format!("{}: {}", s.name, s.detail))
            .collect();
        if !bad.is_empty() || !p.statuses().iter().any(|s| s.name.starts_with(need)) {
            println!(
                "probes bench: {need} skipped: not attached: {}",
                bad.join("; ")
            );
            return None;
        }
        Some(p)
    }

    // ---- uprobes -------------------------------------------------------------------------

    type ForkInit = unsafe extern "C" fn() -> libc::c_int;

    /// `ibv_fork_init` of `libibverbs.so.1` (the library stays loaded).
    fn fork_init() -> Option<ForkInit> {
        let lib: &CStr = c"libibverbs.so.1";
        // SAFETY: dlopen of a library by name; a null return is handled.
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            return None;
        }
        // SAFETY: a symbol lookup in a valid handle.
        let f = unsafe { libc::dlsym(h, c"ibv_fork_init".as_ptr()) };
        // SAFETY: ibv_fork_init is `int ibv_fork_init(void)`.
        (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, ForkInit>(f) })
    }

    /// `iters` calls of `f` in chunks of [`CHUNK`], timing only the calls; `drain` between.
    fn call_loop(f: ForkInit, iters: u64, mut drain: impl FnMut()) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(CHUNK);
            let t = cpu_now();
            for _ in 0..n {
                // SAFETY: ibv_fork_init takes nothing; after the first call it returns at once.
                std::hint::black_box(unsafe { f() });
            }
            total += cpu_now() - t;
            left -= n;
            drain();
        }
        total
    }

    fn uprobes(c: &mut Criterion) -> Option<(Arms, Interleaved)> {
        let Some(f) = fork_init() else {
            println!("probes bench: uprobes skipped: cannot dlopen libibverbs.so.1 (install libibverbs1)");
            return None;
        };
        // SAFETY: as in `call_loop`; the first call does the one-time setup.
        let rc = unsafe { f() };
        assert_eq!(rc, 0, "ibv_fork_init failed: {rc}");
        let cfg = ProbesConfig {
            sched: false,
            tcp: false,
            ..ProbesConfig::default()
        };
        let pid = std::process::id();
        let mut g = c.benchmark_group("probes uprobe ibv_fork_init");
        let arms = Arms {
            off: samples(),
            untracked: samples(),
            tracked: samples(),
            counts_per_iter: 0.0,
        };

        let rec = arms.off.clone();
        g.bench_function("no probes", |b| {
            b.iter_custom(|n| {
                let d = call_loop(f, n, || {});
                rec.borrow_mut().push((n, d));
                d
            })
        });

        let mut p = start(&cfg, "verbs:ibv_fork_init")?;
        let before = hits(&p, "ibv_fork_init");
        call_loop(f, 1000, || {});
        assert_eq!(
            hits(&p, "ibv_fork_init"),
            before,
            "the verbs probes counted calls of a process that is not tracked"
        );
        let rec = arms.untracked.clone();
        g.bench_function("attached, not tracked", |b| {
            b.iter_custom(|n| {
                let d = call_loop(f, n, || {});
                rec.borrow_mut().push((n, d));
                d
            })
        });

        p.track(pid).expect("track the bench's own pid");
        let before = hits(&p, "ibv_fork_init");
        call_loop(f, 1000, || {
            p.poll();
        });
        let got = hits(&p, "ibv_fork_init") - before;
        assert_eq!(
            got, 1000,
            "1000 ibv_fork_init calls of the tracked bench process: the uprobes counted {got}"
        );
        let (calls, _) = p.poll();
        let lost: u64 = p.counts().iter().map(|c| c.lost).sum();
        assert_eq!(lost, 0, "ring records lost with draining between chunks");
        drop(calls);

        let rec = arms.tracked.clone();
        let total = Rc::new(RefCell::new((0u64, 0u64)));
        let tot = total.clone();
        let pr = RefCell::new(p);
        g.bench_function("attached, tracked", |b| {
            b.iter_custom(|n| {
                let h0 = hits(&pr.borrow(), "ibv_fork_init");
                let d = call_loop(f, n, || {
                    pr.borrow_mut().poll();
                });
                pr.borrow_mut().poll();
                let h = hits(&pr.borrow(), "ibv_fork_init") - h0;
                rec.borrow_mut().push((n, d));
                let mut t = tot.borrow_mut();
                t.0 += n;
                t.1 += h;
                d
            })
        });
        g.finish();
        let p = pr.into_inner();
        let lost: u64 = p.counts().iter().map(|c| c.lost).sum();
        if lost > 0 {
            println!("uprobe: {lost} ring records lost during the tracked arm");
        }
        drop(p);
        let inter = interleave(
            || start(&cfg, "verbs:ibv_fork_init"),
            30,
            20_000,
            "ibv_fork_init",
            |p, n| match p {
                Some(p) => call_loop(f, n, || {
                    p.poll();
                }),
                None => call_loop(f, n, || {}),
            },
        )?;
        let (iters, h) = *total.borrow();
        let arms = Arms {
            counts_per_iter: if iters > 0 {
                h as f64 / iters as f64
            } else {
                0.0
            },
            ..arms
        };
        Some((arms, inter))
    }

    // ---- sched ---------------------------------------------------------------------------

    /// The calling thread's CPU mask.
    fn affinity() -> libc::cpu_set_t {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid set of the size passed.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(rc, 0, "sched_getaffinity");
        set
    }

    fn set_affinity(set: &libc::cpu_set_t) {
        // SAFETY: a valid set of the size passed, for the calling thread.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
        assert_eq!(rc, 0, "sched_setaffinity");
    }

    /// A mask with only the last CPU of `set`.
    fn last_cpu(set: &libc::cpu_set_t) -> libc::cpu_set_t {
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .rev()
            // SAFETY: CPU_ISSET reads a valid set.
            .find(|&i| unsafe { libc::CPU_ISSET(i, set) })
            .expect("a CPU in the affinity mask");
        // SAFETY: plain data.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: cpu < CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        one
    }

    fn pipe() -> (libc::c_int, libc::c_int) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2");
        (fds[0], fds[1])
    }

    /// The ping side and the echo thread, both pinned to one CPU.
    struct PingPong {
        to_echo: libc::c_int,
        from_echo: libc::c_int,
        echo: Option<std::thread::JoinHandle<()>>,
    }

    impl PingPong {
        fn new(cpu: libc::cpu_set_t) -> PingPong {
            let (a_r, a_w) = pipe();
            let (b_r, b_w) = pipe();
            let echo = std::thread::spawn(move || {
                set_affinity(&cpu);
                let mut byte = 0u8;
                loop {
                    // SAFETY: a one-byte read into a valid buffer.
                    let n = unsafe { libc::read(a_r, (&raw mut byte).cast(), 1) };
                    if n != 1 {
                        break;
                    }
                    // SAFETY: a one-byte write from a valid buffer.
                    unsafe { libc::write(b_w, (&raw const byte).cast(), 1) };
                }
                // SAFETY: fds this thread owns.
                unsafe {
                    libc::close(a_r);
                    libc::close(b_w);
                }
            });
            PingPong {
                to_echo: a_w,
                from_echo: b_r,
                echo: Some(echo),
            }
        }

        /// `n` round trips.
        fn run(&self, n: u64) -> Duration {
            let t = cpu_now();
            let mut byte = 1u8;
            for _ in 0..n {
                // SAFETY: one-byte write / read on the pipes' open ends.
                unsafe {
                    let w = libc::write(self.to_echo, (&raw const byte).cast(), 1);
                    assert_eq!(w, 1, "ping write");
                    let r = libc::read(self.from_echo, (&raw mut byte).cast(), 1);
                    assert_eq!(r, 1, "pong read");
                }
            }
            cpu_now() - t
        }
    }

    impl Drop for PingPong {
        fn drop(&mut self) {
            // SAFETY: fds this side owns; closing the write end ends the echo thread.
            unsafe { libc::close(self.to_echo) };
            if let Some(e) = self.echo.take() {
                let _ = e.join();
            }
            // SAFETY: as above.
            unsafe { libc::close(self.from_echo) };
        }
    }

    fn sched(c: &mut Criterion) -> Option<(Arms, Interleaved)> {
        let cfg = ProbesConfig {
            verbs: false,
            tcp: false,
            ..ProbesConfig::default()
        };
        let orig = affinity();
        let cpu = last_cpu(&orig);
        set_affinity(&cpu);
        // Spawned before `track` reads /proc/<pid>/task: the echo thread is tracked from the
        // start.
        let pp = PingPong::new(cpu);
        pp.run(1000);
        let pid = std::process::id();
        let arms = Arms {
            off: samples(),
            untracked: samples(),
            tracked: samples(),
            counts_per_iter: 0.0,
        };
        let mut g = c.benchmark_group("probes sched pipe round trip");

        let rec = arms.off.clone();
        g.bench_function("no probes", |b| {
            b.iter_custom(|n| {
                let d = pp.run(n);
                rec.borrow_mut().push((n, d));
                d
            })
        });

        let Some(mut p) = start(&cfg, "sched:") else {
            drop(g);
            drop(pp);
            set_affinity(&orig);
            return None;
        };
        let before = hits(&p, "sched");
        pp.run(1000);
        assert_eq!(
            hits(&p, "sched"),
            before,
            "the sched probes counted events of a process that is not tracked"
        );
        let rec = arms.untracked.clone();
        g.bench_function("attached, not tracked", |b| {
            b.iter_custom(|n| {
                let d = pp.run(n);
                rec.borrow_mut().push((n, d));
                d
            })
        });

        p.track(pid).expect("track the bench's own pid");
        let before = hits(&p, "sched");
        pp.run(1000);
        let got = hits(&p, "sched") - before;
        assert!(
            got >= 1000,
            "1000 pipe round trips of the tracked bench process: the sched probes counted {got}"
        );
        let rec = arms.tracked.clone();
        let total = Rc::new(RefCell::new((0u64, 0u64)));
        let tot = total.clone();
        g.bench_function("attached, tracked", |b| {
            b.iter_custom(|n| {
                let h0 = hits(&p, "sched");
                let d = pp.run(n);
                let h = hits(&p, "sched") - h0;
                rec.borrow_mut().push((n, d));
                let mut t = tot.borrow_mut();
                t.0 += n;
                t.1 += h;
                d
            })
        });
        g.finish();
        drop(p);
        let inter = interleave(
            || start(&cfg, "sched:"),
            60,
            2_500,
            "sched",
            |_, n| pp.run(n),
        );
        drop(pp);
        set_affinity(&orig);
        let (iters, h) = *total.borrow();
        let arms = Arms {
            counts_per_iter: if iters > 0 {
                h as f64 / iters as f64
            } else {
                0.0
            },
            ..arms
        };
        Some((arms, inter?))
    }
}

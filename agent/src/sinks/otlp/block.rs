//! A minimal `block_on` for the exporters' futures on the sink's own threads (the blocking
//! reqwest client must not run inside a tokio runtime, and the SDK does the same with
//! `futures_executor`).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Poll `fut` to completion on this thread, parking between wake-ups.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_a_future_woken_from_another_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f2 = flag.clone();
        let t = std::thread::spawn(move || {
            let w = rx.recv().unwrap();
            f2.store(true, std::sync::atomic::Ordering::SeqCst);
            w.wake();
        });
        let mut sent = Some(tx);
        let v = super::block_on(std::future::poll_fn(|cx| {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                return std::task::Poll::Ready(7);
            }
            if let Some(tx) = sent.take() {
                tx.send(cx.waker().clone()).unwrap();
            }
            std::task::Poll::Pending
        }));
        assert_eq!(v, 7);
        t.join().unwrap();
    }
}

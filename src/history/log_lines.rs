//! The log lines code under test says, for tests that hold the controllers to one line per
//! state change.
//!
//! One subscriber for the whole test process writes each line to the capture of the thread
//! that logs it: a `#[tokio::test]` runs its tasks on its own thread, so a test sees its
//! own lines only. (A subscriber per test, with `set_default`, loses lines: a log site first
//! reached by another test's thread can be cached as uninteresting.)

use std::cell::RefCell;
use std::io;
use std::sync::{Arc, Mutex, Once, PoisonError};

thread_local! {
    static CAPTURE: RefCell<Option<LogLines>> = const { RefCell::new(None) };
}

/// What is logged at info and above on the test's thread, from [`LogLines::capture`] until
/// its [`Capturing`] guard is dropped.
#[derive(Clone, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

/// Captures for as long as it lives.
pub struct Capturing;

impl Drop for Capturing {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

impl LogLines {
    /// Starts capturing this thread's lines; the capture ends with the guard.
    pub fn capture() -> (LogLines, Capturing) {
        static SUBSCRIBER: Once = Once::new();
        SUBSCRIBER.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(|| ThreadCapture)
                .with_ansi(false)
                .without_time()
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other subscriber in the unit tests");
        });
        let lines = LogLines::default();
        CAPTURE.with(|capture| *capture.borrow_mut() = Some(lines.clone()));
        (lines, Capturing)
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The lines so far that contain `text`.
    pub fn containing(&self, text: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(text))
            .collect()
    }
}

/// Writes to the capture of the thread it is written on, if any.
struct ThreadCapture;

impl io::Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(lines) = capture.borrow().as_ref() {
                lines
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

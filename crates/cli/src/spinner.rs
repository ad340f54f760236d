//! A spinner with elapsed time on stderr while something is awaited (a claim, a pool). Drawn
//! only when stderr is a terminal, so scripts and tests see clean output.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// A running spinner; dropping it (or [`Spinner::finish`]) erases its line.
#[derive(Debug)]
pub struct Spinner {
    task: Option<JoinHandle<()>>,
    message: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Spinner {
    /// Starts a spinner showing `message` and the elapsed time (no-op when stderr is not a
    /// terminal).
    pub fn start(message: impl Into<String>) -> Self {
        let message = std::sync::Arc::new(std::sync::Mutex::new(message.into()));
        if !std::io::stderr().is_terminal() {
            return Self {
                task: None,
                message,
            };
        }
        let shown = message.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut frame = 0;
            loop {
                let text = shown.lock().map(|m| m.clone()).unwrap_or_default();
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "\r\x1b[2K{} {text} ({:.1}s)",
                        FRAMES[frame % FRAMES.len()],
                        started.elapsed().as_secs_f64()
                    );
                    let _ = err.flush();
                }
                frame += 1;
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
        });
        Self {
            task: Some(task),
            message,
        }
    }

    /// Replaces the message.
    pub fn set_message(&self, message: impl Into<String>) {
        if let Ok(mut m) = self.message.lock() {
            *m = message.into();
        }
    }

    /// Stops and erases the spinner.
    pub fn finish(mut self) {
        self.clear();
    }

    fn clear(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}

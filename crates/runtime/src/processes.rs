//! Background processes (`/v1/processes`): the table of running and recently finished ones,
//! each with its bounded output log, its standard input and its exit record. The driver of each
//! process runs in a task owned by the server's tracker; this module holds the shared state that
//! the HTTP handlers read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use agent_sandbox_api::runtime::v1::{ExitInfo, ProcessInfo, ProcessState, StreamKind};
use bytes::Bytes;
use tokio::net::unix::pipe::Sender as ChildStdin;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::exec::{Gone, Sink};
use crate::output::{OutputLog, Utf8Carry};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// RFC 3339, whole seconds, UTC.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// One background process.
#[derive(Debug)]
pub(crate) struct Process {
    pub(crate) id: String,
    pub(crate) command: Option<String>,
    pub(crate) argv: Option<Vec<String>>,
    pub(crate) pid: u32,
    pub(crate) pgid: i32,
    started_at: SystemTime,
    log: Mutex<OutputLog>,
    exit: Mutex<Option<(ExitInfo, SystemTime)>>,
    /// Bumped on every change of the log or the exit record; output readers wait on it.
    changed_tx: watch::Sender<u64>,
    pub(crate) stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    stdin_open: AtomicBool,
    /// Cancels the driver (which kills the group): `DELETE` and shutdown.
    pub(crate) cancel: CancellationToken,
}

impl Process {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: String,
        command: Option<String>,
        argv: Option<Vec<String>>,
        pid: u32,
        pgid: i32,
        buffer_bytes: u64,
        stdin: Option<ChildStdin>,
        cancel: CancellationToken,
    ) -> Self {
        let (changed_tx, _) = watch::channel(0);
        Self {
            id,
            command,
            argv,
            pid,
            pgid,
            started_at: SystemTime::now(),
            log: Mutex::new(OutputLog::new(buffer_bytes)),
            exit: Mutex::new(None),
            changed_tx,
            stdin_open: AtomicBool::new(stdin.is_some()),
            stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
            cancel,
        }
    }

    fn bump(&self) {
        self.changed_tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(crate) fn push(&self, kind: StreamKind, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        lock(&self.log).push(kind, Bytes::from(bytes));
        self.bump();
    }

    /// Records the end; output pushed before this call is visible to every reader that sees
    /// the exit.
    pub(crate) fn finish(&self, exit: ExitInfo) {
        *lock(&self.exit) = Some((exit, SystemTime::now()));
        self.stdin_open.store(false, Ordering::Release);
        self.bump();
    }

    pub(crate) fn exit(&self) -> Option<ExitInfo> {
        lock(&self.exit).as_ref().map(|(info, _)| info.clone())
    }

    fn finished_at(&self) -> Option<SystemTime> {
        lock(&self.exit).as_ref().map(|(_, at)| *at)
    }

    pub(crate) fn read(&self, offset: u64, max_chunks: usize) -> crate::output::Read {
        lock(&self.log).read(offset, max_chunks)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed_tx.subscribe()
    }

    pub(crate) fn stdin_open(&self) -> bool {
        self.stdin_open.load(Ordering::Acquire)
    }

    pub(crate) fn close_stdin_flag(&self) {
        self.stdin_open.store(false, Ordering::Release);
    }

    pub(crate) fn info(&self) -> ProcessInfo {
        let (output_start, output_end) = {
            let log = lock(&self.log);
            (log.start(), log.end())
        };
        let exit = lock(&self.exit).clone();
        ProcessInfo {
            id: self.id.clone(),
            command: self.command.clone(),
            argv: self.argv.clone(),
            pid: self.pid,
            state: if exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            started_at: rfc3339(self.started_at),
            finished_at: exit.as_ref().map(|(_, at)| rfc3339(*at)),
            exit: exit.map(|(info, _)| info),
            stdin_open: self.stdin_open(),
            output_start,
            output_end,
        }
    }
}

/// Writes a background process's output into its log, cut at UTF-8 boundaries. Never blocks:
/// the log drops its oldest bytes instead.
#[derive(Debug)]
pub(crate) struct LogSink {
    process: Arc<Process>,
    carry: [Utf8Carry; 2],
}

impl LogSink {
    pub(crate) fn new(process: Arc<Process>) -> Self {
        Self {
            process,
            carry: Default::default(),
        }
    }
}

fn index(kind: StreamKind) -> usize {
    match kind {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}

impl Sink for LogSink {
    async fn output(&mut self, kind: StreamKind, bytes: &[u8]) -> Result<(), Gone> {
        let ready = self.carry[index(kind)].push(bytes);
        self.process.push(kind, ready);
        Ok(())
    }

    async fn eof(&mut self, kind: StreamKind) -> Result<(), Gone> {
        let rest = self.carry[index(kind)].flush();
        self.process.push(kind, rest);
        Ok(())
    }

    fn gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        std::future::pending()
    }
}

/// Which finished processes to forget: those finished longer than `retention` ago, and the
/// oldest beyond `max_kept`. `finished_ages` holds, oldest first, the age of each finished
/// process. Returns one flag per input.
pub(crate) fn to_forget(
    finished_ages: &[Duration],
    retention: Duration,
    max_kept: usize,
) -> Vec<bool> {
    let excess = finished_ages.len().saturating_sub(max_kept);
    finished_ages
        .iter()
        .enumerate()
        .map(|(i, age)| i < excess || *age > retention)
        .collect()
}

/// Running and recently finished background processes, oldest first.
#[derive(Debug)]
pub(crate) struct Table {
    processes: Mutex<Vec<Arc<Process>>>,
    next: AtomicU64,
    boot: String,
    retention: Duration,
    max_finished: usize,
}

impl Table {
    pub(crate) fn new(retention: Duration, max_finished: usize) -> Self {
        // Ids differ between runtime starts, so a client holding an old id gets a 404 rather
        // than another process's output.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ u32::try_from(d.as_secs() & 0xffff_ffff).unwrap_or(0))
            .unwrap_or(0);
        let boot = format!(
            "{:06x}",
            (nanos ^ std::process::id().rotate_left(12)) & 0xff_ffff
        );
        Self {
            processes: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            boot,
            retention,
            max_finished,
        }
    }

    pub(crate) fn next_id(&self) -> String {
        format!(
            "{}-{}",
            self.boot,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub(crate) fn insert(&self, process: Arc<Process>) {
        let mut processes = lock(&self.processes);
        processes.push(process);
        self.prune_locked(&mut processes);
    }

    fn prune_locked(&self, processes: &mut Vec<Arc<Process>>) {
        let now = SystemTime::now();
        let finished: Vec<(usize, Duration)> = processes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.finished_at()
                    .map(|at| (i, now.duration_since(at).unwrap_or_default()))
            })
            .collect();
        let ages: Vec<Duration> = finished.iter().map(|(_, age)| *age).collect();
        let forget = to_forget(&ages, self.retention, self.max_finished);
        let mut drop_index: Vec<usize> = finished
            .iter()
            .zip(forget)
            .filter_map(|((i, _), f)| f.then_some(*i))
            .collect();
        drop_index.sort_unstable_by(|a, b| b.cmp(a));
        for i in drop_index {
            processes.remove(i);
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Process>> {
        let mut processes = lock(&self.processes);
        self.prune_locked(&mut processes);
        processes.iter().find(|p| p.id == id).cloned()
    }

    pub(crate) fn list(&self) -> Vec<Arc<Process>> {
        let mut processes = lock(&self.processes);
        self.prune_locked(&mut processes);
        processes.clone()
    }

    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Process>> {
        let mut processes = lock(&self.processes);
        let index = processes.iter().position(|p| p.id == id)?;
        Some(processes.remove(index))
    }

    /// Prunes after a process finished.
    pub(crate) fn prune(&self) {
        let mut processes = lock(&self.processes);
        self.prune_locked(&mut processes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_old_and_excess_finished_processes() {
        let secs = Duration::from_secs;
        assert_eq!(
            to_forget(&[secs(700), secs(10), secs(5)], secs(600), 10),
            vec![true, false, false]
        );
        assert_eq!(
            to_forget(&[secs(3), secs(2), secs(1)], secs(600), 2),
            vec![true, false, false]
        );
        assert_eq!(to_forget(&[], secs(600), 0), Vec::<bool>::new());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)),
            "2026-01-01T00:00:00Z"
        );
    }

    #[test]
    fn table_keeps_running_and_bounds_finished() {
        let table = Table::new(Duration::from_secs(600), 1);
        let make = |table: &Table| {
            Arc::new(Process::new(
                table.next_id(),
                Some("true".into()),
                None,
                1,
                1,
                1024,
                None,
                CancellationToken::new(),
            ))
        };
        let running = make(&table);
        let first = make(&table);
        let second = make(&table);
        assert_ne!(first.id, second.id);
        table.insert(Arc::clone(&running));
        table.insert(Arc::clone(&first));
        table.insert(Arc::clone(&second));
        first.finish(ExitInfo::default());
        second.finish(ExitInfo::default());
        table.prune();
        let ids: Vec<String> = table.list().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, vec![running.id.clone(), second.id.clone()]);
        assert_eq!(
            table.get(&second.id).unwrap().info().state,
            ProcessState::Exited
        );
        assert!(table.get(&first.id).is_none());
    }
}

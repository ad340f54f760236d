//! [`FakeSandbox`]: an in-memory [`SandboxHandle`] for unit tests of code built on the SDK
//! (feature `fake`). Files live in a map, commands answer from a script, every call is
//! recorded.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{FileEntry, FileType};
use bytes::Bytes;
use jiff::Timestamp;

use crate::error::{Error, Result};
use crate::handle::SandboxHandle;
use crate::options::ExecOptions;
use crate::sandbox::ExecutionResult;

/// An in-memory sandbox.
///
/// ```
/// # tokio_test_block_on(async {
/// use agent_sandbox::fake::FakeSandbox;
/// use agent_sandbox::{ExecutionResult, SandboxHandle};
///
/// let sandbox = FakeSandbox::new()
///     .with_result("python3 tool.py", ExecutionResult::ok("42\n"));
/// sandbox.write("tool.py", "print(42)".into()).await.unwrap();
/// assert_eq!(sandbox.run("python3 tool.py").await.unwrap().stdout, "42\n");
/// assert_eq!(sandbox.commands(), ["python3 tool.py"]);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct FakeSandbox {
    claim: String,
    sandbox: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, Bytes>,
    dirs: std::collections::BTreeSet<String>,
    scripted: BTreeMap<String, VecDeque<ExecutionResult>>,
    default: Option<ExecutionResult>,
    commands: Vec<String>,
    connected: bool,
    closed: bool,
    shutdown_time: Option<Timestamp>,
}

impl Default for FakeSandbox {
    fn default() -> Self {
        Self::new()
    }
}

/// The key of `path` in the file map: the SDK's normal form (the same paths are refused as by
/// a real [`Sandbox`](crate::Sandbox)), without a leading `/` (the fake has no base directory
/// of its own).
fn key(operation: &'static str, path: &str, mutate: bool) -> Result<String> {
    let normal = if mutate {
        crate::paths::normalize_mutable_path(operation, path)?
    } else {
        crate::paths::normalize_path(operation, path)?
    };
    Ok(normal.trim_start_matches('/').to_owned())
}

/// [`key`] for the fake's own setters and getters, which take what a test wrote.
fn normalize(path: &str) -> String {
    key("use", path, false).unwrap_or_else(|_| path.to_owned())
}

impl FakeSandbox {
    /// An empty, connected fake named `fake-claim` / `fake-sandbox`.
    pub fn new() -> Self {
        Self {
            claim: "fake-claim".to_owned(),
            sandbox: "fake-sandbox".to_owned(),
            state: Mutex::new(State {
                connected: true,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Scripts the result of `command`, a command as one line (as [`FakeSandbox::commands`]
    /// records it), queued: repeated calls take the next; the last one repeats.
    #[must_use]
    pub fn with_result(self, command: impl Into<String>, result: ExecutionResult) -> Self {
        self.state()
            .scripted
            .entry(command.into())
            .or_default()
            .push_back(result);
        self
    }

    /// The result of any command without a script (otherwise [`Error::Unscripted`]).
    #[must_use]
    pub fn with_default_result(self, result: ExecutionResult) -> Self {
        self.state().default = Some(result);
        self
    }

    /// Adds a file.
    #[must_use]
    pub fn with_file(self, path: &str, data: impl Into<Bytes>) -> Self {
        self.state().files.insert(normalize(path), data.into());
        self
    }

    /// The commands run so far, in order, each as one line ([`ExecCommand::to_line`]: an
    /// argv's words quoted and joined).
    ///
    /// [`ExecCommand::to_line`]: crate::ExecCommand::to_line
    pub fn commands(&self) -> Vec<String> {
        self.state().commands.clone()
    }

    /// A file's content.
    pub fn file(&self, path: &str) -> Option<Bytes> {
        self.state().files.get(&normalize(path)).cloned()
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// The expiry last set by `extend_ttl`.
    pub fn shutdown_time(&self) -> Option<Timestamp> {
        self.state().shutdown_time
    }

    fn not_found(&self, operation: &str, path: &str) -> Error {
        Error::Http {
            operation: format!("{operation} {path}"),
            sandbox: self.sandbox.clone(),
            status: 404,
            body: format!("{{\"code\":\"NOT_FOUND\",\"message\":\"{path} not found\"}}"),
        }
    }

    fn check(&self) -> Result<()> {
        if self.state().connected {
            Ok(())
        } else {
            Err(Error::NotConnected {
                sandbox: self.sandbox.clone(),
                reason: "disconnected".to_owned(),
            })
        }
    }

    fn is_dir(state: &State, path: &str) -> bool {
        path.is_empty()
            || state.dirs.contains(path)
            || state
                .files
                .keys()
                .any(|f| f.starts_with(&format!("{path}/")))
    }
}

impl SandboxHandle for FakeSandbox {
    fn claim_name(&self) -> &str {
        &self.claim
    }
    fn sandbox_name(&self) -> &str {
        &self.sandbox
    }
    fn pod_name(&self) -> &str {
        &self.sandbox
    }
    fn pod_ip(&self) -> Option<&str> {
        Some("127.0.0.1")
    }
    fn is_ready(&self) -> bool {
        self.state().connected
    }
    async fn open(&self) -> Result<()> {
        self.state().connected = true;
        Ok(())
    }
    async fn disconnect(&self) {
        self.state().connected = false;
    }
    async fn close(&self) -> Result<()> {
        let mut state = self.state();
        state.connected = false;
        state.closed = true;
        Ok(())
    }
    async fn extend_ttl(&self, ttl: Duration) -> Result<Timestamp> {
        let at = Timestamp::now()
            .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
        self.state().shutdown_time = Some(at);
        Ok(at)
    }
    async fn run(&self, command: &str) -> Result<ExecutionResult> {
        self.run_with(ExecOptions::new(command)).await
    }
    async fn run_with(&self, options: ExecOptions) -> Result<ExecutionResult> {
        self.check()?;
        let mut state = self.state();
        let command = options.command.to_line();
        state.commands.push(command.clone());
        if let Some(queue) = state.scripted.get_mut(&command) {
            let result = if queue.len() > 1 {
                queue.pop_front()
            } else {
                queue.front().cloned()
            };
            if let Some(result) = result {
                return Ok(result);
            }
        }
        state.default.clone().ok_or(Error::Unscripted { command })
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        self.check()?;
        let key = key("write", path, true)?;
        self.state().files.insert(key, data);
        Ok(())
    }
    async fn read(&self, path: &str) -> Result<Bytes> {
        self.check()?;
        let key = key("read", path, false)?;
        let file = self.state().files.get(&key).cloned();
        file.ok_or_else(|| self.not_found("read", path))
    }
    async fn list(&self, path: &str) -> Result<Vec<FileEntry>> {
        self.check()?;
        let dir = key("list", path, false)?;
        let state = self.state();
        if !Self::is_dir(&state, &dir) {
            drop(state);
            return Err(self.not_found("list", path));
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut entries: BTreeMap<String, FileEntry> = BTreeMap::new();
        let entry = |name: &str, size: u64, file_type| FileEntry {
            name: name.to_owned(),
            size,
            file_type,
            modified_at: "1970-01-01T00:00:00Z".to_owned(),
            mode: if file_type == FileType::Directory {
                "0755"
            } else {
                "0644"
            }
            .to_owned(),
        };
        for (file, data) in &state.files {
            if let Some(rest) = file.strip_prefix(&prefix) {
                match rest.split_once('/') {
                    None => {
                        entries.insert(
                            rest.to_owned(),
                            entry(rest, data.len() as u64, FileType::File),
                        );
                    }
                    Some((sub, _)) => {
                        entries.insert(sub.to_owned(), entry(sub, 4096, FileType::Directory));
                    }
                }
            }
        }
        for d in &state.dirs {
            if let Some(rest) = d.strip_prefix(&prefix) {
                let sub = rest.split('/').next().unwrap_or(rest);
                if !sub.is_empty() {
                    entries.insert(sub.to_owned(), entry(sub, 4096, FileType::Directory));
                }
            }
        }
        Ok(entries.into_values().collect())
    }
    async fn exists(&self, path: &str) -> Result<bool> {
        self.check()?;
        let path = key("stat", path, false)?;
        let state = self.state();
        Ok(state.files.contains_key(&path) || Self::is_dir(&state, &path))
    }
    async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.check()?;
        let key = key("remove", path, true)?;
        let mut state = self.state();
        if state.files.remove(&key).is_some() {
            return Ok(());
        }
        if !Self::is_dir(&state, &key) || key.is_empty() {
            drop(state);
            return Err(self.not_found("remove", path));
        }
        let prefix = format!("{key}/");
        let has_children = state.files.keys().any(|f| f.starts_with(&prefix))
            || state.dirs.iter().any(|d| d.starts_with(&prefix));
        if has_children && !recursive {
            return Err(Error::Http {
                operation: format!("remove {path}"),
                sandbox: self.sandbox.clone(),
                status: 409,
                body: "{\"code\":\"CONFLICT\",\"message\":\"directory not empty\"}".to_owned(),
            });
        }
        state.files.retain(|f, _| !f.starts_with(&prefix));
        state.dirs.retain(|d| d != &key && !d.starts_with(&prefix));
        Ok(())
    }
    async fn mkdir(&self, path: &str) -> Result<()> {
        self.check()?;
        let key = key("mkdir", path, true)?;
        let mut state = self.state();
        let mut so_far = String::new();
        for part in key.split('/').filter(|p| !p.is_empty()) {
            if !so_far.is_empty() {
                so_far.push('/');
            }
            so_far.push_str(part);
            state.dirs.insert(so_far.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_commands_and_lifecycle() {
        let fake = FakeSandbox::new()
            .with_result("ls", ExecutionResult::ok("a\n"))
            .with_result("ls", ExecutionResult::ok("a\nb\n"))
            .with_file("a", "1");
        assert_eq!(fake.run("ls").await.unwrap().stdout, "a\n");
        assert_eq!(fake.run("ls").await.unwrap().stdout, "a\nb\n");
        assert_eq!(fake.run("ls").await.unwrap().stdout, "a\nb\n");
        assert!(matches!(
            fake.run("rm -rf /").await,
            Err(Error::Unscripted { .. })
        ));

        fake.write("src/lib/x.py", "x".into()).await.unwrap();
        fake.mkdir("empty/dir").await.unwrap();
        let names: Vec<String> = fake
            .list(".")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["a", "empty", "src"]);
        assert!(fake.exists("src/lib").await.unwrap());
        assert!(fake.remove("src", false).await.unwrap_err().status() == Some(409));
        fake.remove("src", true).await.unwrap();
        assert!(!fake.exists("src/lib/x.py").await.unwrap());
        assert!(fake.read("nope").await.unwrap_err().is_not_found());
        // The same paths are refused as by a real sandbox.
        fake.write("keep", "k".into()).await.unwrap();
        for base in ["", ".", "keep/.."] {
            assert!(matches!(
                fake.remove(base, true).await,
                Err(Error::InvalidPath { .. })
            ));
        }
        assert!(matches!(
            fake.read("../x").await,
            Err(Error::InvalidPath { .. })
        ));
        assert_eq!(fake.read("./x/../keep").await.unwrap(), Bytes::from("k"));

        fake.disconnect().await;
        assert!(!fake.is_ready());
        assert!(matches!(
            fake.read("a").await,
            Err(Error::NotConnected { .. })
        ));
        fake.open().await.unwrap();
        assert_eq!(fake.read("a").await.unwrap(), Bytes::from("1"));
        fake.extend_ttl(Duration::from_secs(60)).await.unwrap();
        assert!(fake.shutdown_time().is_some());
        fake.close().await.unwrap();
        assert!(fake.is_closed());
    }
}

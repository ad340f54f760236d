//! Containers' logs on disk: where the kubelet writes them ([`pod_paths`], [`log_file`]) and
//! how it serves them ([`read`]): whole, tailed, limited or followed while the container runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

use crate::error::{Error, Result};

/// How often a followed log is polled for growth.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// The directories of one pod.
#[derive(Clone, Debug)]
pub(crate) struct PodPaths {
    pub(crate) root: PathBuf,
    /// The directory plain (unconfined) processes run in.
    pub(crate) app: PathBuf,
    pub(crate) logs: PathBuf,
    /// Where a confined pod's storage is mounted, in its own mount namespace (on the host, an
    /// empty directory).
    pub(crate) storage: PathBuf,
}

/// The directories of a pod under `pods_dir`.
pub(crate) fn pod_paths(pods_dir: &Path, namespace: &str, name: &str, uid: &str) -> PodPaths {
    let root = pods_dir.join(namespace).join(format!("{name}-{uid}"));
    PodPaths {
        app: root.join("app"),
        logs: root.join("logs"),
        storage: root.join("storage"),
        root,
    }
}

/// The log file of a container (the previous run's when `previous`).
pub(crate) fn log_file(paths: &PodPaths, container: &str, previous: bool) -> PathBuf {
    if previous {
        paths.logs.join(format!("{container}.previous.log"))
    } else {
        paths.logs.join(format!("{container}.log"))
    }
}

/// What part of a log to serve (the query of `pods/log`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// The previous run's log instead of the current one.
    pub previous: bool,
    /// Only the last lines.
    pub tail_lines: Option<usize>,
    /// At most this many bytes of what exists now.
    pub limit_bytes: Option<usize>,
    /// Keep streaming what the container writes until it stops.
    pub follow: bool,
}

/// A log as it is read: the bytes so far, then (when followed) what the container writes next.
pub type LogStream = BoxStream<'static, Bytes>;

/// Keeps the last `lines` lines of `text`.
pub(crate) fn tail(text: &[u8], lines: usize) -> &[u8] {
    if lines == 0 {
        return &[];
    }
    let trimmed = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (index, byte) in trimmed.iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == lines {
                return &text[index + 1..];
            }
        }
    }
    text
}

/// Reads container `container`'s log of pod `pod` (its name, for messages) from `paths`;
/// `running` says whether the container still runs, which ends a followed log when it turns
/// false.
pub(crate) async fn read<F>(
    paths: &PodPaths,
    pod: &str,
    container: &str,
    options: &LogOptions,
    running: F,
) -> Result<LogStream>
where
    F: Fn() -> bool + Send + 'static,
{
    let file = log_file(paths, container, options.previous);
    let content = tokio::fs::read(&file).await.map_err(|_| {
        let (pod, container) = (pod.to_owned(), container.to_owned());
        if options.previous {
            Error::NoPreviousLog { pod, container }
        } else {
            Error::NoLog { pod, container }
        }
    })?;
    let mut body = match options.tail_lines {
        Some(lines) => tail(&content, lines).to_vec(),
        None => content.clone(),
    };
    if let Some(limit) = options.limit_bytes {
        body.truncate(limit);
    }
    let follow = options.follow && !options.previous && running();
    if !follow {
        return Ok(Box::pin(futures::stream::once(std::future::ready(
            Bytes::from(body),
        ))));
    }
    let follower = Follower {
        file,
        offset: content.len() as u64,
        running: Box::new(running),
        first: Some(Bytes::from(body)),
        done: false,
    };
    Ok(Box::pin(futures::stream::unfold(
        follower,
        |mut f| async move { f.next().await.map(|bytes| (bytes, f)) },
    )))
}

struct Follower {
    file: PathBuf,
    offset: u64,
    running: Box<dyn Fn() -> bool + Send>,
    first: Option<Bytes>,
    done: bool,
}

impl Follower {
    async fn read_new(&mut self) -> Option<Bytes> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = tokio::fs::File::open(&self.file).await.ok()?;
        file.seek(std::io::SeekFrom::Start(self.offset))
            .await
            .ok()?;
        let mut buffer = Vec::new();
        file.read_to_end(&mut buffer).await.ok()?;
        if buffer.is_empty() {
            return None;
        }
        self.offset += buffer.len() as u64;
        Some(Bytes::from(buffer))
    }

    async fn next(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take().filter(|b| !b.is_empty()) {
            return Some(first);
        }
        loop {
            if self.done {
                return None;
            }
            if let Some(bytes) = self.read_new().await {
                return Some(bytes);
            }
            if !(self.running)() {
                self.done = true;
                // Whatever was written between the last read and the exit.
                return self.read_new().await;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 1), b"c");
        assert_eq!(tail(b"a\n", 5), b"a\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
    }
}

//! Options: how a [`Client`](crate::Client) connects and waits, how a sandbox is created, how a
//! command runs.
//!
//! Every options type is `#[non_exhaustive]` with a `Default` and builder-style setters, so
//! fields can be added without breaking callers.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::wire;
use jiff::Timestamp;

use crate::error::{Error, Result};

/// How the SDK reaches the router (and through it, the sandboxes).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionMode {
    /// A router URL reachable from here: an in-cluster agent using
    /// `http://sandbox-router-svc.agent-sandbox-system.svc:8080`, or a local router.
    Direct {
        /// Base URL, `http://` or `https://`.
        url: String,
    },
    /// The default: a local listener on `127.0.0.1:0`; every accepted connection is a
    /// Kubernetes port-forward to a Ready pod behind the EndpointSlices of
    /// `sandbox-router-svc` in `router_namespace`.
    PortForward {
        /// Where the router runs; [`wire::SYSTEM_NAMESPACE`] by default, as in our manifests.
        router_namespace: String,
    },
    /// The address in the status of a `gateway.networking.k8s.io/v1` Gateway.
    Gateway {
        /// Name of the Gateway.
        name: String,
        /// Its namespace.
        namespace: String,
        /// `http` or `https`.
        scheme: String,
    },
}

impl Default for ConnectionMode {
    fn default() -> Self {
        Self::port_forward()
    }
}

impl ConnectionMode {
    /// [`ConnectionMode::Direct`] to `url`.
    pub fn direct(url: impl Into<String>) -> Self {
        Self::Direct { url: url.into() }
    }

    /// [`ConnectionMode::PortForward`] to the router in [`wire::SYSTEM_NAMESPACE`].
    pub fn port_forward() -> Self {
        Self::PortForward {
            router_namespace: wire::SYSTEM_NAMESPACE.to_owned(),
        }
    }

    /// [`ConnectionMode::PortForward`] to the router in `router_namespace`.
    pub fn port_forward_in(router_namespace: impl Into<String>) -> Self {
        Self::PortForward {
            router_namespace: router_namespace.into(),
        }
    }

    /// [`ConnectionMode::Gateway`] over plain HTTP.
    pub fn gateway(name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self::Gateway {
            name: name.into(),
            namespace: namespace.into(),
            scheme: "http".to_owned(),
        }
    }

    /// Short name for logs and benchmarks: `direct`, `port-forward`, `gateway`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Direct { .. } => "direct",
            Self::PortForward { .. } => "port-forward",
            Self::Gateway { .. } => "gateway",
        }
    }
}

/// Retries of idempotent operations (file operations, listings, reads).
///
/// Retried: connection errors and HTTP 500/502/503/504. Backoff: none before the second
/// attempt, then `initial_backoff · 2^(n-1)` capped at `max_backoff`, each ±25 % jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in total, at least 1 (default 6).
    pub max_attempts: u32,
    /// First backoff (default 500 ms).
    pub initial_backoff: Duration,
    /// Longest backoff (default 8 s).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries.
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// `max_attempts` attempts with the default backoff.
    pub fn attempts(max_attempts: u32) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            ..Self::default()
        }
    }

    /// Sets the backoff bounds.
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// The pause before attempt `attempt` (1-based: the first retry, attempt 2, starts at once),
    /// without jitter.
    pub(crate) fn base_delay(&self, attempt: u32) -> Duration {
        if attempt <= 2 {
            return Duration::ZERO;
        }
        let exponent = (attempt - 3).min(20);
        self.initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff)
    }

    /// The pause before attempt `attempt`, with ±25 % jitter.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        if base.is_zero() {
            return base;
        }
        base.mul_f64(0.75 + fastrand::f64() * 0.5)
    }
}

/// Options of a [`Client`](crate::Client).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Namespace of claims (default `default`).
    pub namespace: String,
    /// How to reach the router (default: port-forward to [`wire::SYSTEM_NAMESPACE`]).
    pub connection: ConnectionMode,
    /// How long `create_sandbox` waits for the claim to be Ready (default 180 s).
    pub sandbox_ready_timeout: Duration,
    /// How long port-forward mode waits for a ready router endpoint (default 30 s).
    pub port_forward_ready_timeout: Duration,
    /// How long Gateway mode waits for an address (default 180 s).
    pub gateway_ready_timeout: Duration,
    /// Budget of deleting claims after a failure, on `close` and on auto cleanup (default 30 s).
    pub cleanup_timeout: Duration,
    /// Deadline of one HTTP request to the router, unless the call sets its own (default 60 s;
    /// `run` and `exec_stream` use the command's timeout plus a margin instead).
    pub request_timeout: Duration,
    /// Retries of file operations (default: 6 attempts).
    pub retry: RetryPolicy,
    /// Bearer token for the router (`--auth token` or a scoped token), sent as
    /// `Authorization: Bearer ...`.
    pub router_token: Option<String>,
    /// The router's signing key (`--auth scoped`): when set, every request carries a token
    /// minted for its own sandbox (valid [`SCOPED_TOKEN_TTL`]) and `router_token` is not used.
    /// For orchestrators and operators trusted with the key, not for code an agent controls.
    pub router_signing_key: Option<SigningKey>,
    /// Largest answer the SDK buffers in memory (default [`DEFAULT_MAX_RESPONSE_BYTES`],
    /// 256 MiB): listings, command results, [`Sandbox::read`](crate::Sandbox::read). A larger
    /// answer, or one whose `Content-Length` claims more, is
    /// [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge) before it is buffered.
    /// Streams ([`Sandbox::download`](crate::Sandbox::download), `exec_stream`) are not
    /// buffered and have no such cap.
    pub max_response_bytes: u64,
}

/// Default of [`ClientOptions::max_response_bytes`]: 256 MiB, above the largest `/execute`
/// answer of a default runtime (16 MiB per stream, JSON-escaped).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 * 1024 * 1024;

/// The longest lifetime the SDK gives a claim or a token: 10 years (87600 h). Longer
/// durations are an error naming it, never a silently missing expiry; times this far ahead fit
/// every RFC 3339 timestamp and the controller's arithmetic with centuries to spare.
pub const MAX_TTL: Duration = agent_sandbox_api::units::MAX_DURATION;

/// How [`MAX_TTL`] is named in errors.
pub(crate) const MAX_TTL_TEXT: &str = agent_sandbox_api::units::MAX_DURATION_TEXT;

/// Checks a lifetime against [`MAX_TTL`], for the option named `option`.
pub(crate) fn check_ttl(option: &'static str, ttl: Duration) -> Result<Duration> {
    if ttl > MAX_TTL {
        return Err(Error::InvalidOption {
            option,
            message: format!(
                "{}s is longer than the maximum of {MAX_TTL_TEXT} (agent_sandbox::MAX_TTL)",
                ttl.as_secs()
            ),
        });
    }
    Ok(ttl)
}

/// `now + ttl`, for a `ttl` of at most [`MAX_TTL`]: an error naming the maximum otherwise, never
/// a missing or saturated time.
pub(crate) fn expiry(option: &'static str, now: Timestamp, ttl: Duration) -> Result<Timestamp> {
    let ttl = check_ttl(option, ttl)?;
    let out_of_range = |e: jiff::Error| Error::InvalidOption {
        option,
        message: format!("now + {}s is not a valid time: {e}", ttl.as_secs()),
    };
    let signed = jiff::SignedDuration::try_from(ttl).map_err(out_of_range)?;
    now.checked_add(signed).map_err(out_of_range)
}

/// How long the tokens minted with [`ClientOptions::router_signing_key`] are valid (a fresh one
/// is minted for every request).
pub const SCOPED_TOKEN_TTL: Duration = Duration::from_secs(600);

/// A router signing key (at least 32 bytes, checked when the client connects). Its `Debug`
/// output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Arc<[u8]>);

impl SigningKey {
    /// Wraps `key` (the contents of the router's `--signing-key-file`).
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        Self(Arc::from(key.into()))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(<{} bytes, redacted>)", self.0.len())
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            namespace: wire::DEFAULT_SANDBOX_NAMESPACE.to_owned(),
            connection: ConnectionMode::default(),
            sandbox_ready_timeout: Duration::from_secs(180),
            port_forward_ready_timeout: Duration::from_secs(30),
            gateway_ready_timeout: Duration::from_secs(180),
            cleanup_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            router_token: None,
            router_signing_key: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl ClientOptions {
    /// Sets the claims' namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the connection mode.
    #[must_use]
    pub fn connection(mut self, connection: ConnectionMode) -> Self {
        self.connection = connection;
        self
    }

    /// Port-forward mode with the router in `namespace`.
    #[must_use]
    pub fn router_namespace(self, namespace: impl Into<String>) -> Self {
        self.connection(ConnectionMode::port_forward_in(namespace))
    }

    /// Sets how long `create_sandbox` waits for Ready.
    #[must_use]
    pub fn sandbox_ready_timeout(mut self, timeout: Duration) -> Self {
        self.sandbox_ready_timeout = timeout;
        self
    }

    /// Sets the default deadline of one HTTP request.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the retry policy of file operations.
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the router bearer token.
    #[must_use]
    pub fn router_token(mut self, token: impl Into<String>) -> Self {
        self.router_token = Some(token.into());
        self
    }

    /// Sets the router's signing key: the client mints a scoped token per sandbox.
    #[must_use]
    pub fn router_signing_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.router_signing_key = Some(SigningKey::new(key));
        self
    }

    /// Sets the largest answer buffered in memory.
    #[must_use]
    pub fn max_response_bytes(mut self, bytes: u64) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Sets the cleanup budget.
    #[must_use]
    pub fn cleanup_timeout(mut self, timeout: Duration) -> Self {
        self.cleanup_timeout = timeout;
        self
    }
}

/// A step of [`Client::create_sandbox_with`](crate::Client::create_sandbox_with), for
/// progress output (a spinner, a log line).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// The claim was created.
    ClaimCreated {
        /// Its generated name.
        claim: String,
    },
    /// The claim is waiting (reason and message of its `Ready=False` condition).
    Waiting {
        /// Condition reason.
        reason: String,
        /// Condition message.
        message: String,
    },
    /// The claim got its sandbox.
    SandboxAssigned {
        /// The Sandbox name.
        sandbox: String,
    },
    /// The claim is Ready; connecting to the router.
    Connecting,
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Options of [`Client::create_sandbox_with`](crate::Client::create_sandbox_with).
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Claim expiry: `spec.lifecycle.shutdownTime = now + shutdown_after`, policy `Delete`;
    /// at most [`MAX_TTL`] (longer is an error). `None`: the claim never expires.
    pub shutdown_after: Option<Duration>,
    /// Extra labels on the claim.
    pub labels: BTreeMap<String, String>,
    /// Labels added to the sandbox's pod (`spec.additionalPodMetadata`).
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations added to the sandbox's pod.
    pub pod_annotations: BTreeMap<String, String>,
    /// Called at each step.
    pub progress: Option<ProgressFn>,
    /// Overrides [`ClientOptions::sandbox_ready_timeout`].
    pub ready_timeout: Option<Duration>,
    /// The sandbox's idle lifecycle (`spec.idleLifecycle` of the claim), instead of its pool's
    /// `claimDefaults` or its template's.
    pub idle_lifecycle: Option<agent_sandbox_api::sandbox::IdleLifecycle>,
}

impl fmt::Debug for CreateOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateOptions")
            .field("shutdown_after", &self.shutdown_after)
            .field("labels", &self.labels)
            .field("pod_labels", &self.pod_labels)
            .field("pod_annotations", &self.pod_annotations)
            .field("progress", &self.progress.is_some())
            .field("ready_timeout", &self.ready_timeout)
            .field("idle_lifecycle", &self.idle_lifecycle)
            .finish()
    }
}

impl CreateOptions {
    /// Sets the claim's expiry relative to now.
    #[must_use]
    pub fn shutdown_after(mut self, after: Duration) -> Self {
        self.shutdown_after = Some(after);
        self
    }

    /// Adds a label to the claim.
    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds a label to the sandbox's pod.
    #[must_use]
    pub fn pod_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.pod_labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation to the sandbox's pod.
    #[must_use]
    pub fn pod_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.pod_annotations.insert(key.into(), value.into());
        self
    }

    /// Sets the progress callback.
    #[must_use]
    pub fn on_progress(mut self, progress: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }

    /// Sets how long to wait for Ready.
    #[must_use]
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = Some(timeout);
        self
    }

    /// Suspends the sandbox after `after` without activity (requests through the router,
    /// including ones still running); the next request wakes it. Whole seconds, at least one.
    #[must_use]
    pub fn suspend_when_idle(mut self, after: Duration) -> Self {
        self.idle_lifecycle = Some(agent_sandbox_api::sandbox::IdleLifecycle {
            active_ttl_seconds: Some(i64::try_from(after.as_secs().max(1)).unwrap_or(i64::MAX)),
            active_expiration_policy: Some(
                agent_sandbox_api::sandbox::ActiveExpirationPolicy::Suspend,
            ),
            ..Default::default()
        });
        self
    }

    /// Sets the whole idle lifecycle (see [`CreateOptions::suspend_when_idle`]).
    #[must_use]
    pub fn idle_lifecycle(mut self, lifecycle: agent_sandbox_api::sandbox::IdleLifecycle) -> Self {
        self.idle_lifecycle = Some(lifecycle);
        self
    }
}

/// What a command runs: the one representation of it for `run_with`, `exec_stream` and
/// `start_process`. Each variant means the same on every endpoint that can run it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecCommand {
    /// A command line as upstream's `/execute` takes it: split into words shlex-style (POSIX
    /// rules, like Python's `shlex.split`) by the runtime and run without a shell; `run_with`
    /// sends it as it is. The `/v1` endpoints (`exec_stream`, background processes) take only a
    /// shell line or an argv, and run it as [`ExecCommand::Shell`]: to mean one of the two on
    /// every endpoint, say which.
    Line(String),
    /// A shell command line, run as `/bin/sh -c <line>` (pipes, `$(...)`, `&&`, `cd`).
    Shell(String),
    /// A program and its arguments, run without a shell (the program is looked up in `PATH`).
    /// `/execute` has no argv field: `run_with` sends the words quoted ([`shell_quote`]) so that
    /// the runtime's shlex split gives back exactly these words.
    Argv(Vec<String>),
}

impl Default for ExecCommand {
    fn default() -> Self {
        Self::Line(String::new())
    }
}

impl ExecCommand {
    /// The command as one line: the line itself, or the argv's words quoted with
    /// [`shell_quote`] and joined by spaces (which a shell and a shlex split both read back as
    /// these words).
    pub fn to_line(&self) -> String {
        match self {
            Self::Line(line) | Self::Shell(line) => line.clone(),
            Self::Argv(words) => words
                .iter()
                .map(|word| shell_quote(word))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// Quotes `word` for a POSIX shell (and for a shlex split, which reads quotes the same way) when
/// it needs it: words of only letters, digits and `_@%+=:,./-` stay as they are; others are put
/// in single quotes, with each `'` written as `'\''`.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// How to run a command: `run_with`, `exec_stream`, `start_process`.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ExecOptions {
    /// What runs: a command line split without a shell ([`ExecOptions::new`]), a shell line
    /// ([`ExecOptions::shell`]) or a program and its arguments ([`ExecOptions::argv`]).
    pub command: ExecCommand,
    /// Working directory, relative to the sandbox's base directory.
    pub cwd: Option<String>,
    /// Environment variables added for the command.
    pub env: BTreeMap<String, String>,
    /// Command timeout: the runtime kills the whole process group after it. The request's
    /// deadline is this plus a margin. Default: the runtime's (300 s); the request deadline is
    /// then [`ClientOptions::request_timeout`] or 310 s, whichever is longer.
    pub timeout: Option<Duration>,
    /// Bytes for standard input.
    pub stdin: Option<String>,
    /// Cap on the bytes kept of each of stdout and stderr.
    pub max_output_bytes: Option<u64>,
    /// Attempts when the request fails before the command could have started (connection
    /// errors, 502/503/504). Default 1: a command is never replayed unless the caller opts in,
    /// because running it twice may not be harmless.
    pub max_attempts: u32,
}

impl ExecOptions {
    /// Options for running `command`.
    pub fn with_command(command: ExecCommand) -> Self {
        Self {
            command,
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Options for the command line `command` ([`ExecCommand::Line`]: split without a shell by
    /// `run_with`, as upstream's `/execute`).
    pub fn new(command: impl Into<String>) -> Self {
        Self::with_command(ExecCommand::Line(command.into()))
    }

    /// Options for `command` run through `/bin/sh -c` ([`ExecCommand::Shell`]).
    pub fn shell(command: impl Into<String>) -> Self {
        Self::with_command(ExecCommand::Shell(command.into()))
    }

    /// Options for a program with arguments, no shell ([`ExecCommand::Argv`]).
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_command(ExecCommand::Argv(
            argv.into_iter().map(Into::into).collect(),
        ))
    }

    /// Sets whether a shell runs the command line: `true` makes a [`ExecCommand::Line`] a
    /// [`ExecCommand::Shell`], `false` the other way round. An argv stays an argv.
    #[must_use]
    pub fn with_shell(mut self, shell: bool) -> Self {
        self.command = match (self.command, shell) {
            (ExecCommand::Line(line), true) => ExecCommand::Shell(line),
            (ExecCommand::Shell(line), false) => ExecCommand::Line(line),
            (command, _) => command,
        };
        self
    }

    /// Sets the working directory.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds an environment variable.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets the command timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets standard input.
    #[must_use]
    pub fn stdin(mut self, stdin: impl Into<String>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }

    /// Caps the output kept per stream.
    #[must_use]
    pub fn max_output_bytes(mut self, bytes: u64) -> Self {
        self.max_output_bytes = Some(bytes);
        self
    }

    /// Opts in to replaying the request up to `attempts` times in total when it fails on the
    /// way (only for commands that are safe to run twice).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The request deadline: the command's timeout plus a margin, never shorter than
    /// `default`.
    pub(crate) fn deadline(&self, default: Duration) -> Duration {
        match self.timeout {
            Some(timeout) => timeout.saturating_add(Duration::from_secs(10)),
            None => default.max(Duration::from_secs(310)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_once_then_doubles_to_the_cap() {
        let policy = RetryPolicy::default();
        let delays: Vec<Duration> = (1..=8).map(|a| policy.base_delay(a)).collect();
        assert_eq!(
            delays,
            [0, 0, 500, 1000, 2000, 4000, 8000, 8000].map(Duration::from_millis)
        );
        for _ in 0..100 {
            let jittered = policy.delay(4);
            assert!(
                jittered >= Duration::from_millis(750) && jittered <= Duration::from_millis(1250)
            );
        }
    }

    #[test]
    fn deadlines_saturate() {
        let huge = ExecOptions::new("x").timeout(Duration::MAX);
        assert_eq!(huge.deadline(Duration::from_secs(60)), Duration::MAX);
        assert!(check_ttl("ttl", MAX_TTL).is_ok());
        let error = check_ttl("ttl", MAX_TTL + Duration::from_secs(1)).err();
        assert!(
            error.is_some_and(|e| e.to_string().contains("87600h (10 years)")),
            "the error names the maximum"
        );
    }

    #[test]
    fn exec_defaults_never_replay() {
        assert_eq!(ExecOptions::new("ls").max_attempts, 1);
        assert_eq!(ExecOptions::shell("ls").max_attempts(0).max_attempts, 1);
        assert_eq!(
            ExecOptions::shell("ls").command,
            ExecCommand::Shell("ls".to_owned())
        );
    }

    #[test]
    fn one_command_has_one_representation() {
        assert_eq!(
            ExecOptions::new("ls -l").with_shell(true),
            ExecOptions::shell("ls -l")
        );
        assert_eq!(
            ExecOptions::shell("ls -l").with_shell(false),
            ExecOptions::new("ls -l")
        );
        let argv = ExecOptions::argv(["printf", "%s", "a b", "it's", ""]);
        assert_eq!(argv.clone().with_shell(true), argv);
        assert_eq!(argv.command.to_line(), "printf %s 'a b' 'it'\\''s' ''");
        assert_eq!(ExecCommand::Shell("a | b".into()).to_line(), "a | b");
    }
}

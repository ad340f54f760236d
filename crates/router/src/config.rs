//! Configuration: the [`Config`] the router runs with, the [`Auth`] it enforces, and the
//! command-line [`Args`] (flags with `SANDBOX_ROUTER_*` environment fallbacks) that produce them.
//! `Args` is a `clap::Args` so that another binary (the CLI) can embed the router with the same
//! flags; in-process users build a [`Config`] directly.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_api::names::is_dns_label;
use agent_sandbox_api::token;
use agent_sandbox_api::units::{parse_positive_duration, parse_size, parse_size_usize};
use agent_sandbox_api::wire::ROUTER_PORT;

use crate::error::{Error, Result};

/// Shortest accepted static bearer token, in bytes after trimming whitespace.
pub const MIN_STATIC_TOKEN_BYTES: usize = 32;

/// Everything the router needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address of the proxy listener (also `/healthz`, `/readyz`, `/metrics`).
    pub listen: SocketAddr,
    /// Who may send requests.
    pub auth: Auth,
    /// Deadline of a request without `X-Sandbox-Timeout`, and the cap on that header.
    pub max_timeout: Duration,
    /// Time one TCP connect attempt to a pod may take.
    pub connect_timeout: Duration,
    /// Further connect attempts after a failed one (nothing was sent, so retrying is safe).
    pub connect_retries: u32,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: u64,
    /// Largest request head (request line and headers); larger ones get 431.
    pub max_header_bytes: usize,
    /// After a shutdown signal, how long in-flight requests and tunnels get to finish.
    pub shutdown_grace: Duration,
    /// Watch Sandboxes and Pods in this namespace only (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Log one line per proxied request.
    pub access_log: bool,
    /// How long an idle pooled connection to a pod is kept.
    pub pool_idle_timeout: Duration,
}

/// Defaults, shared by [`Config::new`] and [`Args`].
pub mod defaults {
    /// `--max-timeout-seconds`: an hour, so commands that run for many minutes are not cut off.
    pub const MAX_TIMEOUT_SECONDS: &str = "3600";
    /// `--connect-timeout-seconds`.
    pub const CONNECT_TIMEOUT_SECONDS: &str = "5";
    /// `--connect-retries`.
    pub const CONNECT_RETRIES: u32 = 3;
    /// `--max-body-bytes`: as large as the runtime's own upload limit.
    pub const MAX_BODY_BYTES: &str = "16GiB";
    /// `--max-header-bytes`.
    pub const MAX_HEADER_BYTES: &str = "32KiB";
    /// `--shutdown-grace-seconds`.
    pub const SHUTDOWN_GRACE_SECONDS: &str = "30";
    /// `--pool-idle-seconds`.
    pub const POOL_IDLE_SECONDS: &str = "60";
}

impl Config {
    /// The defaults, listening on `listen`, with no authentication (for embedding and tests).
    pub fn new(listen: SocketAddr) -> Self {
        let secs = |s: &str| parse_positive_duration(s).unwrap_or(Duration::from_secs(1));
        let size = |s: &str| parse_size(s).unwrap_or(1 << 20);
        Self {
            listen,
            auth: Auth::None,
            max_timeout: secs(defaults::MAX_TIMEOUT_SECONDS),
            connect_timeout: secs(defaults::CONNECT_TIMEOUT_SECONDS),
            connect_retries: defaults::CONNECT_RETRIES,
            max_body_bytes: size(defaults::MAX_BODY_BYTES),
            max_header_bytes: parse_size_usize(defaults::MAX_HEADER_BYTES).unwrap_or(32 << 10),
            shutdown_grace: secs(defaults::SHUTDOWN_GRACE_SECONDS),
            namespace: None,
            access_log: true,
            pool_idle_timeout: secs(defaults::POOL_IDLE_SECONDS),
        }
    }
}

/// Who may send requests through the router.
#[derive(Clone)]
pub enum Auth {
    /// Anyone who can reach the router (development only; logged as a warning at startup).
    None,
    /// Requests must carry `Authorization: Bearer <token>` with this one token.
    Token(Secret),
    /// Requests must carry a scoped token ([`agent_sandbox_api::token`]) for the sandbox they
    /// address, signed with one of these keys (several during a key rotation).
    Scoped(Vec<Secret>),
}

impl Auth {
    /// The mode's name as `--auth` spells it.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Token(_) => "token",
            Self::Scoped(_) => "scoped",
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::Scoped(keys) => write!(f, "Scoped({} key(s), <redacted>)", keys.len()),
        }
    }
}

/// Secret bytes (a token or a signing key), trimmed of surrounding whitespace; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps `bytes`, trimming surrounding ASCII whitespace.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Self(bytes.as_ref().trim_ascii().to_vec())
    }

    /// The bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// No authentication (development only).
    None,
    /// One static bearer token (`--token-file`).
    Token,
    /// Per-sandbox HMAC-signed tokens (`--signing-key-file`).
    Scoped,
}

/// Command-line flags of `sandbox-router`, each with an environment fallback. Invalid values are
/// errors that name the flag, never silently replaced by defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address of the proxy listener (also serves /healthz, /readyz and /metrics).
    #[arg(long, env = "SANDBOX_ROUTER_LISTEN",
          default_value_t = SocketAddr::from(([0, 0, 0, 0], ROUTER_PORT)))]
    pub listen: SocketAddr,
    /// Authentication of clients: none (development only), token (one static bearer token) or
    /// scoped (HMAC-signed tokens bound to one sandbox and an expiry).
    #[arg(long, env = "SANDBOX_ROUTER_AUTH", value_enum)]
    pub auth: AuthMode,
    /// File holding the static bearer token (`--auth token`; at least 32 bytes).
    #[arg(
        long,
        env = "SANDBOX_ROUTER_TOKEN_FILE",
        required_if_eq("auth", "token")
    )]
    pub token_file: Option<PathBuf>,
    /// File holding a scoped-token signing key (`--auth scoped`; at least 32 bytes). Repeat the
    /// flag, or separate paths with commas, to accept tokens signed by any of several keys while
    /// rotating.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_SIGNING_KEY_FILE",
        value_delimiter = ',',
        required_if_eq("auth", "scoped")
    )]
    pub signing_key_file: Vec<PathBuf>,
    /// Deadline of a request without X-Sandbox-Timeout, and the cap on that header (seconds).
    #[arg(long = "max-timeout-seconds", env = "SANDBOX_ROUTER_MAX_TIMEOUT_SECONDS",
          default_value = defaults::MAX_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub max_timeout: Duration,
    /// Time one TCP connect attempt to a sandbox pod may take (seconds).
    #[arg(long = "connect-timeout-seconds", env = "SANDBOX_ROUTER_CONNECT_TIMEOUT_SECONDS",
          default_value = defaults::CONNECT_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub connect_timeout: Duration,
    /// Further connect attempts after a failed one, with backoff (nothing was sent yet).
    #[arg(long, env = "SANDBOX_ROUTER_CONNECT_RETRIES", default_value_t = defaults::CONNECT_RETRIES)]
    pub connect_retries: u32,
    /// Largest request body (`64MiB`, `16GiB`, bytes); larger ones get 413.
    #[arg(long, env = "SANDBOX_ROUTER_MAX_BODY_BYTES", default_value = defaults::MAX_BODY_BYTES,
          value_parser = parse_size)]
    pub max_body_bytes: u64,
    /// Largest request line plus headers; larger ones get 431.
    #[arg(long, env = "SANDBOX_ROUTER_MAX_HEADER_BYTES", default_value = defaults::MAX_HEADER_BYTES,
          value_parser = parse_header_size)]
    pub max_header_bytes: usize,
    /// Seconds in-flight requests and WebSocket tunnels get after SIGTERM.
    #[arg(long = "shutdown-grace-seconds", env = "SANDBOX_ROUTER_SHUTDOWN_GRACE_SECONDS",
          default_value = defaults::SHUTDOWN_GRACE_SECONDS, value_parser = parse_positive_duration)]
    pub shutdown_grace: Duration,
    /// Watch Sandboxes and Pods in this namespace only (default: all namespaces).
    #[arg(long, env = "SANDBOX_ROUTER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Log one line per proxied request (`true` or `false`).
    #[arg(long, env = "SANDBOX_ROUTER_ACCESS_LOG", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub access_log: bool,
    /// Seconds an idle pooled connection to a sandbox pod is kept.
    #[arg(long = "pool-idle-seconds", env = "SANDBOX_ROUTER_POOL_IDLE_SECONDS",
          default_value = defaults::POOL_IDLE_SECONDS, value_parser = parse_positive_duration)]
    pub pool_idle_timeout: Duration,
}

impl Args {
    /// The configuration these flags describe, with token and key files read.
    pub fn into_config(self) -> Result<Config> {
        let auth = match self.auth {
            AuthMode::None => Auth::None,
            AuthMode::Token => {
                let path = self.token_file.ok_or(Error::MissingSecret {
                    mode: "token",
                    flag: "--token-file",
                })?;
                Auth::Token(read_static_token(&path)?)
            }
            AuthMode::Scoped => {
                if self.signing_key_file.is_empty() {
                    return Err(Error::MissingSecret {
                        mode: "scoped",
                        flag: "--signing-key-file",
                    });
                }
                let keys = self
                    .signing_key_file
                    .iter()
                    .map(|path| read_signing_key(path))
                    .collect::<Result<Vec<_>>>()?;
                Auth::Scoped(keys)
            }
        };
        if let Some(namespace) = &self.namespace
            && !is_dns_label(namespace)
        {
            return Err(Error::InvalidNamespace {
                namespace: namespace.clone(),
            });
        }
        Ok(Config {
            listen: self.listen,
            auth,
            max_timeout: self.max_timeout,
            connect_timeout: self.connect_timeout,
            connect_retries: self.connect_retries,
            max_body_bytes: self.max_body_bytes,
            max_header_bytes: self.max_header_bytes,
            shutdown_grace: self.shutdown_grace,
            namespace: self.namespace,
            access_log: self.access_log,
            pool_idle_timeout: self.pool_idle_timeout,
        })
    }
}

fn read_secret(what: &'static str, path: &Path) -> Result<Secret> {
    let bytes = std::fs::read(path).map_err(|source| Error::ReadSecret {
        what,
        path: path.to_owned(),
        source,
    })?;
    Ok(Secret::new(bytes))
}

/// Reads a static bearer token (trimmed, at least [`MIN_STATIC_TOKEN_BYTES`]).
pub fn read_static_token(path: &Path) -> Result<Secret> {
    let secret = read_secret("static token", path)?;
    if secret.expose().len() < MIN_STATIC_TOKEN_BYTES {
        return Err(Error::TokenTooShort {
            path: path.to_owned(),
            len: secret.expose().len(),
            min: MIN_STATIC_TOKEN_BYTES,
        });
    }
    Ok(secret)
}

/// Reads a scoped-token signing key (trimmed, at least [`token::MIN_KEY_BYTES`]).
pub fn read_signing_key(path: &Path) -> Result<Secret> {
    let secret = read_secret("signing key", path)?;
    token::signing_key(secret.expose()).map_err(|source| Error::SigningKey {
        path: path.to_owned(),
        source,
    })?;
    Ok(secret)
}

/// Parses a header size limit: a size between 1 KiB and 16 MiB.
fn parse_header_size(value: &str) -> std::result::Result<usize, String> {
    let bytes = parse_size_usize(value)?;
    if !(1 << 10..=16 << 20).contains(&bytes) {
        return Err(format!("`{value}` must be between 1KiB and 16MiB"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use clap::Parser;
    use pretty_assertions::assert_eq;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> std::result::Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("sandbox-router").chain(args.iter().copied()))
            .map(|cli| cli.args)
    }

    #[test]
    fn defaults_match_config_new() {
        let config = parse(&["--auth", "none"]).unwrap().into_config().unwrap();
        let built = Config::new(config.listen);
        assert_eq!(config.listen.port(), ROUTER_PORT);
        assert_eq!(config.max_timeout, Duration::from_secs(3600));
        assert_eq!(config.max_timeout, built.max_timeout);
        assert_eq!(config.connect_timeout, built.connect_timeout);
        assert_eq!(config.connect_retries, built.connect_retries);
        assert_eq!(config.max_body_bytes, 16 << 30);
        assert_eq!(config.max_body_bytes, built.max_body_bytes);
        assert_eq!(config.max_header_bytes, 32 << 10);
        assert_eq!(config.max_header_bytes, built.max_header_bytes);
        assert_eq!(config.shutdown_grace, built.shutdown_grace);
        assert_eq!(config.pool_idle_timeout, built.pool_idle_timeout);
        assert!(config.access_log);
        assert!(matches!(config.auth, Auth::None));
    }

    #[test]
    fn auth_must_be_chosen() {
        let error = parse(&[]).unwrap_err();
        assert!(error.to_string().contains("--auth"), "{error}");
    }

    #[test]
    fn token_and_scoped_modes_need_their_files() {
        let error = parse(&["--auth", "token"]).unwrap_err();
        assert!(error.to_string().contains("--token-file"), "{error}");
        let error = parse(&["--auth", "scoped"]).unwrap_err();
        assert!(error.to_string().contains("--signing-key-file"), "{error}");
    }

    #[test]
    fn secrets_are_read_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        let key2 = dir.path().join("key2");
        std::fs::write(&key2, "fedcba9876543210fedcba9876543210").unwrap();

        let config = parse(&["--auth", "token", "--token-file", token.to_str().unwrap()])
            .unwrap()
            .into_config()
            .unwrap();
        let Auth::Token(secret) = &config.auth else {
            panic!("{:?}", config.auth)
        };
        assert_eq!(secret.expose(), b"0123456789abcdef0123456789abcdef");
        // Never printed.
        assert!(!format!("{config:?}").contains("0123456789"));

        let keys = format!("{},{}", token.display(), key2.display());
        let config = parse(&["--auth", "scoped", "--signing-key-file", &keys])
            .unwrap()
            .into_config()
            .unwrap();
        assert!(matches!(&config.auth, Auth::Scoped(keys) if keys.len() == 2));

        let error = parse(&["--auth", "token", "--token-file", short.to_str().unwrap()])
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(
            matches!(error, Error::TokenTooShort { len: 4, .. }),
            "{error}"
        );
        let error = parse(&[
            "--auth",
            "scoped",
            "--signing-key-file",
            short.to_str().unwrap(),
        ])
        .unwrap()
        .into_config()
        .unwrap_err();
        assert!(matches!(error, Error::SigningKey { .. }), "{error}");
        let missing = dir.path().join("missing");
        let error = parse(&["--auth", "token", "--token-file", missing.to_str().unwrap()])
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
    }

    #[test]
    fn invalid_values_name_the_flag() {
        for (flag, value) in [
            ("--max-timeout-seconds", "0"),
            ("--max-timeout-seconds", "forever"),
            ("--connect-timeout-seconds", "0"),
            ("--max-body-bytes", "lots"),
            ("--max-header-bytes", "100"),
            ("--listen", "nowhere"),
            ("--auth", "maybe"),
            ("--access-log", "sometimes"),
        ] {
            let error = parse(&["--auth", "none", flag, value]).unwrap_err();
            assert!(error.to_string().contains(flag), "{flag}: {error}");
        }
        let error = parse(&["--auth", "none", "--namespace", "Not_A_Label"])
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(matches!(error, Error::InvalidNamespace { .. }), "{error}");
    }
}

//! [`MessagesClient`]: the HTTP client for Anthropic's Messages API (`POST /v1/messages`) over
//! reqwest, with the API key header, `anthropic-version`, retries on 408/409/429/5xx/529 that
//! honour `retry-after`, optional streaming, and errors that say what to fix. The key is never
//! logged or printed: [`ApiKey`]'s `Debug` is redacted and no request is logged with headers.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use jiff::Timestamp;
use reqwest::header::{HeaderMap, HeaderValue};

use crate::error::{Error, Result};
use crate::messages::{ErrorBody, MessagesRequest, MessagesResponse};
use crate::retry::{self, Backoff};
use crate::stream::{Accumulator, SseParser, StreamError};

/// Environment variable holding the API key.
pub const ENV_API_KEY: &str = "ANTHROPIC_API_KEY";
/// Environment variable overriding the base URL (proxies, gateways, tests).
pub const ENV_BASE_URL: &str = "ANTHROPIC_BASE_URL";
/// The public endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The model used unless `--model` (or `ANTHROPIC_MODEL`) says otherwise: a Sonnet model id
/// published by Anthropic, the fast general model with tool use. Model ids are retired over
/// time; an unknown id comes back as a 404 `not_found_error` naming it, and the agent says to
/// pass `--model`.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-6";
/// Response token cap unless `--max-tokens` says otherwise (room for thinking plus a long
/// file in one tool call, well under every current model's output limit).
pub const DEFAULT_MAX_TOKENS: u32 = 16_000;
/// The API version header value.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Deadline of one HTTP attempt (a long non-streaming answer can take minutes).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// An API key. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key (surrounding whitespace removed: a pasted newline is a classic 401).
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into().trim().to_owned())
    }

    fn header(&self) -> Result<HeaderValue> {
        let mut value = HeaderValue::from_str(&self.0).map_err(|_| Error::InvalidApiKey)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// How to reach the Messages API.
#[derive(Clone, Debug)]
pub struct MessagesConfig {
    /// The API key (`x-api-key`).
    pub api_key: ApiKey,
    /// Base URL, without `/v1/messages`.
    pub base_url: String,
    /// Model id.
    pub model: String,
    /// Response token cap.
    pub max_tokens: u32,
    /// How many retries after the first attempt, and the waits between them.
    pub retry: Backoff,
    /// Deadline of one attempt.
    pub request_timeout: Duration,
    /// Use server-sent events (the answer is assembled before it is returned).
    pub stream: bool,
}

impl MessagesConfig {
    /// Defaults for everything but the key.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            api_key,
            base_url: DEFAULT_BASE_URL.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            max_tokens: DEFAULT_MAX_TOKENS,
            retry: Backoff::default(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stream: false,
        }
    }
}

/// What the tool loop needs from a model: its id, its token cap, and one request-response.
/// [`MessagesClient`] is the real one; tests script others.
pub trait Model: Send + Sync {
    /// Model id put in requests.
    fn model(&self) -> &str;
    /// `max_tokens` put in requests.
    fn max_tokens(&self) -> u32;
    /// Sends one request (retrying as it sees fit).
    fn create(
        &self,
        request: &MessagesRequest,
    ) -> impl Future<Output = Result<MessagesResponse>> + Send;
}

/// A client of the Messages API.
#[derive(Clone, Debug)]
pub struct MessagesClient {
    http: reqwest::Client,
    config: MessagesConfig,
    url: String,
}

/// The outcome of one attempt that did not succeed.
enum Failure {
    /// Worth another attempt after the server's delay (if it named one).
    Retry(Error, Option<Duration>),
    /// Final.
    Fatal(Error),
}

impl MessagesClient {
    /// A client for `config`.
    pub fn new(config: MessagesConfig) -> Result<Self> {
        // Idempotent: the process-wide provider kube's TLS stack uses as well.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", config.api_key.header()?);
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("sandbox-agent/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .timeout(config.request_timeout)
            .build()
            .map_err(|source| Error::HttpClient { source })?;
        let url = format!("{}/v1/messages", config.base_url.trim_end_matches('/'));
        Ok(Self { http, config, url })
    }

    /// The configuration.
    pub fn config(&self) -> &MessagesConfig {
        &self.config
    }

    /// Sends `request`, retrying retryable failures per the policy.
    pub async fn send(&self, request: &MessagesRequest) -> Result<MessagesResponse> {
        let mut request = request.clone();
        request.stream = self.config.stream;
        let mut retries = 0u32;
        loop {
            let failure = match self.attempt(&request).await {
                Ok(response) => return Ok(response),
                Err(failure) => failure,
            };
            match failure {
                Failure::Retry(error, delay) if retries < self.config.retry.max_retries => {
                    retries += 1;
                    let wait = retry::backoff(
                        &self.config.retry,
                        retries,
                        delay,
                        0.5 + fastrand::f64() / 2.0,
                    );
                    tracing::warn!(
                        retry = retries,
                        of = self.config.retry.max_retries,
                        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        error = %error,
                        "Messages API request failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                Failure::Retry(error, _) if retries > 0 => {
                    return Err(Error::RetriesExhausted {
                        attempts: retries + 1,
                        source: Box::new(error),
                    });
                }
                Failure::Retry(error, _) | Failure::Fatal(error) => return Err(error),
            }
        }
    }

    async fn attempt(&self, request: &MessagesRequest) -> Result<MessagesResponse, Failure> {
        let response = self
            .http
            .post(&self.url)
            .json(request)
            .send()
            .await
            .map_err(|source| Failure::Retry(self.transport(source), None))?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            let headers = response.headers().clone();
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            let retryable = retry::is_retryable(status, header("x-should-retry"));
            let delay = retry::server_delay(
                header("retry-after-ms"),
                header("retry-after"),
                Timestamp::now(),
            );
            let request_id = header("request-id").map(str::to_owned);
            let body = response.text().await.unwrap_or_default();
            let error = self.api_error(status, &body, request_id);
            return Err(if retryable {
                Failure::Retry(error, delay)
            } else {
                Failure::Fatal(error)
            });
        }
        if request.stream {
            return self.read_stream(response).await;
        }
        let body = response
            .bytes()
            .await
            .map_err(|source| Failure::Retry(self.transport(source), None))?;
        serde_json::from_slice(&body).map_err(|source| Failure::Fatal(Error::Decode { source }))
    }

    async fn read_stream(
        &self,
        mut response: reqwest::Response,
    ) -> Result<MessagesResponse, Failure> {
        let mut parser = SseParser::default();
        let mut acc = Accumulator::default();
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|source| Failure::Retry(self.transport(source), None))?;
            let Some(chunk) = chunk else { break };
            for event in parser.push(&chunk) {
                acc.apply(&event).map_err(|e| self.stream_failure(e))?;
            }
            if acc.is_done() {
                break;
            }
        }
        acc.finish().map_err(|e| self.stream_failure(e))
    }

    fn stream_failure(&self, error: StreamError) -> Failure {
        match error {
            StreamError::Server(kind, message) => {
                let status = match kind.as_str() {
                    "overloaded_error" => 529,
                    "rate_limit_error" => 429,
                    "api_error" => 500,
                    _ => 400,
                };
                let error = self.api_error_parts(status, kind, message, None);
                if retry::is_retryable(status, None) {
                    Failure::Retry(error, None)
                } else {
                    Failure::Fatal(error)
                }
            }
            StreamError::Incomplete => Failure::Retry(
                Error::Stream {
                    detail: "the stream ended before message_stop".to_owned(),
                },
                None,
            ),
            StreamError::Malformed(detail) => Failure::Fatal(Error::Stream { detail }),
        }
    }

    fn transport(&self, source: reqwest::Error) -> Error {
        Error::Transport {
            url: redact_url(&self.url),
            source: source.without_url(),
        }
    }

    fn api_error(&self, status: u16, body: &str, request_id: Option<String>) -> Error {
        let (kind, message) = match serde_json::from_str::<ErrorBody>(body) {
            Ok(parsed) => (parsed.error.kind, parsed.error.message),
            Err(_) => (String::new(), body.chars().take(300).collect()),
        };
        self.api_error_parts(status, kind, message, request_id)
    }

    fn api_error_parts(
        &self,
        status: u16,
        kind: String,
        message: String,
        request_id: Option<String>,
    ) -> Error {
        Error::Api {
            status,
            kind,
            message,
            request_id,
            hint: hint(status, &self.config),
        }
    }
}

impl Model for MessagesClient {
    fn model(&self) -> &str {
        &self.config.model
    }
    fn max_tokens(&self) -> u32 {
        self.config.max_tokens
    }
    fn create(
        &self,
        request: &MessagesRequest,
    ) -> impl Future<Output = Result<MessagesResponse>> + Send {
        self.send(request)
    }
}

/// What to do about an error status (sans IO).
pub fn hint(status: u16, config: &MessagesConfig) -> String {
    match status {
        400 => format!(
            "the request was rejected as invalid: check --model ({}) and --max-tokens ({}), \
             which must not exceed the model's output limit",
            config.model, config.max_tokens
        ),
        401 => format!(
            "the API key was not accepted: set {ENV_API_KEY} to a valid key from the Claude \
             Console (no quotes, no spaces), and check {ENV_BASE_URL} if you use a proxy"
        ),
        403 => format!(
            "the API key is not allowed to do this: check that its workspace may use model {} \
             and that the organisation has credit",
            config.model
        ),
        404 => format!(
            "not found: check --model ({}) is a model id and {ENV_BASE_URL} ({}) points at the \
             Messages API",
            config.model,
            redact_url(&config.base_url)
        ),
        413 => "the conversation is too large for one request: lower --tool-output-limit or \
                --max-turns"
            .to_owned(),
        429 => "rate limited: wait a minute or raise the organisation's rate limits".to_owned(),
        529 => "the API is overloaded: try again later".to_owned(),
        500..=599 => "the API had an internal error: try again later".to_owned(),
        _ => "unexpected answer from the Messages API".to_owned(),
    }
}

/// `url` without user information (a proxy URL may carry a password).
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "<invalid URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn key_is_redacted_and_trimmed() {
        let key = ApiKey::new(" sk-ant-secret\n");
        assert_eq!(key, ApiKey("sk-ant-secret".to_owned()));
        let config = MessagesConfig::new(key);
        assert!(!format!("{config:?}").contains("secret"));
    }

    #[test]
    fn urls_lose_credentials() {
        assert_eq!(
            redact_url("https://user:pw@proxy.example/v1"),
            "https://proxy.example/v1"
        );
        assert_eq!(redact_url("http://127.0.0.1:9/"), "http://127.0.0.1:9/");
    }

    #[test]
    fn hints_name_what_to_fix() {
        let config = MessagesConfig::new(ApiKey::new("k"));
        assert!(hint(401, &config).contains(ENV_API_KEY));
        assert!(hint(400, &config).contains("--max-tokens"));
        assert!(hint(403, &config).contains(DEFAULT_MODEL));
    }
}

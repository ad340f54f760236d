//! The four tools the model gets, each a thin wrapper over the SDK's [`SandboxHandle`]:
//! `run_command` (through `/bin/sh -c`, with a timeout), `write_file`, `read_file` and
//! `list_files`. What they return is trimmed for the model with an explicit marker saying how
//! much was cut; failures come back as `is_error` outcomes, never as errors of the loop.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use agent_sandbox::{ExecOptions, FileType, SandboxHandle};
use serde_json::{Value, json};

use crate::messages::ToolDefinition;

/// Tool names.
pub const RUN_COMMAND: &str = "run_command";
/// Tool names.
pub const WRITE_FILE: &str = "write_file";
/// Tool names.
pub const READ_FILE: &str = "read_file";
/// Tool names.
pub const LIST_FILES: &str = "list_files";

/// Limits of what tools do and return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolLimits {
    /// Bytes of each of stdout and stderr, and of a file read, shown to the model.
    pub output_limit: usize,
    /// Bytes the sandbox keeps of each stream of a command (what exceeds it is never sent).
    pub capture_limit: u64,
    /// Command timeout when the model names none.
    pub command_timeout: Duration,
    /// Longest timeout the model may ask for.
    pub max_command_timeout: Duration,
    /// Entries a recursive listing shows at most.
    pub list_limit: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            output_limit: 16 * 1024,
            capture_limit: 1024 * 1024,
            command_timeout: Duration::from_secs(120),
            max_command_timeout: Duration::from_secs(600),
            list_limit: 500,
        }
    }
}

/// What a tool call produced, for the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The `tool_result` content.
    pub content: String,
    /// The tool failed.
    pub is_error: bool,
}

impl ToolOutcome {
    fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// The tool definitions sent with every request.
pub fn definitions(limits: &ToolLimits) -> Vec<ToolDefinition> {
    let tool = |name: &str, description: String, schema: Value| ToolDefinition {
        name: name.to_owned(),
        description,
        input_schema: schema,
    };
    vec![
        tool(
            RUN_COMMAND,
            format!(
                "Run a shell command in the sandbox with /bin/sh -c, in the working directory. \
                 Pipes, &&, redirects, $VARS and cd work. Returns the exit code, stdout and \
                 stderr; each is cut to about {} bytes (a marker says how much was cut). The \
                 whole process group is killed after timeout_seconds (default {}, at most {}).",
                limits.output_limit,
                limits.command_timeout.as_secs(),
                limits.max_command_timeout.as_secs()
            ),
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The shell command line."},
                    "timeout_seconds": {"type": "integer", "minimum": 1,
                        "description": "Kill the command after this many seconds."}
                },
                "required": ["command"]
            }),
        ),
        tool(
            WRITE_FILE,
            "Create or overwrite a text file in the sandbox. The path is relative to the \
             working directory (directories in it are created), or absolute inside it."
                .to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, e.g. src/main.py."},
                    "content": {"type": "string", "description": "The whole file content."}
                },
                "required": ["path", "content"]
            }),
        ),
        tool(
            READ_FILE,
            format!(
                "Read a text file from the sandbox (cut to about {} bytes, with a marker).",
                limits.output_limit
            ),
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path."}
                },
                "required": ["path"]
            }),
        ),
        tool(
            LIST_FILES,
            "List a directory in the sandbox: directories end with /, files show their size. \
             With recursive, lists the whole tree below it (bounded)."
                .to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory, default \".\"."},
                    "recursive": {"type": "boolean", "description": "Descend into directories."}
                }
            }),
        ),
    ]
}

fn str_field<'a>(input: &'a Value, field: &str) -> Option<&'a str> {
    input.get(field).and_then(Value::as_str)
}

/// The line printed for a tool call, after `[tool] ` (sans IO), e.g.
/// `write_file: fib.py (157 bytes)`.
pub fn describe(name: &str, input: &Value) -> String {
    match name {
        RUN_COMMAND => format!("{name}: {}", str_field(input, "command").unwrap_or("?")),
        WRITE_FILE => format!(
            "{name}: {} ({} bytes)",
            str_field(input, "path").unwrap_or("?"),
            str_field(input, "content").map_or(0, str::len)
        ),
        READ_FILE => format!("{name}: {}", str_field(input, "path").unwrap_or("?")),
        LIST_FILES => format!(
            "{name}: {}{}",
            str_field(input, "path").unwrap_or("."),
            if input.get("recursive").and_then(Value::as_bool) == Some(true) {
                " (recursive)"
            } else {
                ""
            }
        ),
        other => format!("{other} (unknown tool)"),
    }
}

/// Runs one tool call against the sandbox.
pub async fn execute<H: SandboxHandle>(
    sandbox: &H,
    name: &str,
    input: &Value,
    limits: &ToolLimits,
) -> ToolOutcome {
    let missing = |field: &str| {
        ToolOutcome::error(format!(
            "invalid input for {name}: the string field `{field}` is required"
        ))
    };
    match name {
        RUN_COMMAND => {
            let Some(command) = str_field(input, "command") else {
                return missing("command");
            };
            let timeout = input
                .get("timeout_seconds")
                .and_then(Value::as_u64)
                .map_or(limits.command_timeout, Duration::from_secs)
                .clamp(Duration::from_secs(1), limits.max_command_timeout);
            run_command(sandbox, command, timeout, limits).await
        }
        WRITE_FILE => {
            let (Some(path), Some(content)) =
                (str_field(input, "path"), str_field(input, "content"))
            else {
                return missing(if str_field(input, "path").is_none() {
                    "path"
                } else {
                    "content"
                });
            };
            match sandbox.write(path, content.to_owned().into()).await {
                Ok(()) => ToolOutcome::ok(format!("wrote {} bytes to {path}", content.len())),
                Err(error) => {
                    ToolOutcome::error(format!("failed to write {path}: {}", error_chain(&error)))
                }
            }
        }
        READ_FILE => {
            let Some(path) = str_field(input, "path") else {
                return missing("path");
            };
            match sandbox.read(path).await {
                Ok(data) => {
                    let head = &data[..data.len().min(8192)];
                    if head.contains(&0) {
                        ToolOutcome::ok(format!(
                            "{path} is a binary file of {} bytes (not shown)",
                            data.len()
                        ))
                    } else if data.is_empty() {
                        ToolOutcome::ok(format!("{path} is empty"))
                    } else {
                        ToolOutcome::ok(trim(&String::from_utf8_lossy(&data), limits.output_limit))
                    }
                }
                Err(error) => {
                    ToolOutcome::error(format!("failed to read {path}: {}", error_chain(&error)))
                }
            }
        }
        LIST_FILES => {
            let path = str_field(input, "path").unwrap_or(".");
            let recursive = input.get("recursive").and_then(Value::as_bool) == Some(true);
            list_files(sandbox, path, recursive, limits).await
        }
        other => ToolOutcome::error(format!(
            "unknown tool {other:?}: use one of {RUN_COMMAND}, {WRITE_FILE}, {READ_FILE}, {LIST_FILES}"
        )),
    }
}

async fn run_command<H: SandboxHandle>(
    sandbox: &H,
    command: &str,
    timeout: Duration,
    limits: &ToolLimits,
) -> ToolOutcome {
    let options = ExecOptions::shell(command)
        .timeout(timeout)
        .max_output_bytes(limits.capture_limit);
    let result = match sandbox.run_with(options).await {
        Ok(result) => result,
        Err(error) => {
            return ToolOutcome::error(format!(
                "failed to run the command: {}",
                error_chain(&error)
            ));
        }
    };
    let mut content = format!("exit code: {}", result.exit_code);
    if result.timed_out {
        let _ = write!(
            content,
            " (timed out after {} s; the process group was killed)",
            timeout.as_secs()
        );
    }
    for (label, text, truncated) in [
        ("stdout", &result.stdout, result.stdout_truncated),
        ("stderr", &result.stderr, result.stderr_truncated),
    ] {
        if text.is_empty() && !truncated {
            continue;
        }
        let _ = write!(content, "\n{label}:\n{}", trim(text, limits.output_limit));
        if truncated {
            let _ = write!(
                content,
                "\n[{label} exceeded {} bytes in the sandbox; the rest was not kept]",
                limits.capture_limit
            );
        }
    }
    if result.stdout.is_empty() && result.stderr.is_empty() {
        content.push_str(" (no output)");
    }
    ToolOutcome {
        content,
        is_error: result.timed_out,
    }
}

async fn list_files<H: SandboxHandle>(
    sandbox: &H,
    path: &str,
    recursive: bool,
    limits: &ToolLimits,
) -> ToolOutcome {
    let root = path.trim_end_matches('/');
    let root = if root.is_empty() { "." } else { root };
    let mut lines = Vec::new();
    let mut queue = VecDeque::from([(root.to_owned(), String::new())]);
    let mut cut = false;
    while let Some((dir, prefix)) = queue.pop_front() {
        let entries = match sandbox.list(&dir).await {
            Ok(entries) => entries,
            // The root must list; a subdirectory that vanished or is unreadable is noted.
            Err(error) if prefix.is_empty() => {
                return ToolOutcome::error(format!(
                    "failed to list {path}: {}",
                    error_chain(&error)
                ));
            }
            Err(error) => {
                lines.push(format!("{prefix}  [not listed: {}]", error_chain(&error)));
                continue;
            }
        };
        for entry in entries {
            if lines.len() >= limits.list_limit {
                cut = true;
                break;
            }
            let shown = format!("{prefix}{}", entry.name);
            match entry.file_type {
                FileType::Directory => {
                    lines.push(format!("{shown}/"));
                    if recursive {
                        queue.push_back((format!("{dir}/{}", entry.name), format!("{shown}/")));
                    }
                }
                FileType::Symlink => lines.push(format!("{shown}@")),
                _ => lines.push(format!("{shown}  {} bytes", entry.size)),
            }
        }
        if cut {
            break;
        }
    }
    if lines.is_empty() {
        return ToolOutcome::ok(format!("{path} is empty"));
    }
    let mut content = lines.join("\n");
    if cut {
        let _ = write!(
            content,
            "\n[listing cut at {} entries; list a subdirectory to see more]",
            limits.list_limit
        );
    }
    ToolOutcome::ok(content)
}

/// `text` cut to about `limit` bytes for the model (sans IO): the first two fifths and the last
/// three fifths are kept (errors are usually at the end), joined by a marker that says how many
/// bytes were cut.
pub fn trim(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let head_end = floor_char_boundary(text, limit * 2 / 5);
    let tail_start = ceil_char_boundary(text, text.len() - (limit - limit * 2 / 5));
    let cut = tail_start - head_end;
    format!(
        "{}\n[… {cut} of {} bytes cut …]\n{}",
        &text[..head_end],
        text.len(),
        &text[tail_start..]
    )
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_char_boundary(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

/// An error and its sources, joined with `: `.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        let next_text = next.to_string();
        if !text.contains(&next_text) {
            let _ = write!(text, ": {next_text}");
        }
        source = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use agent_sandbox::ExecutionResult;
    use agent_sandbox::fake::FakeSandbox;
    use pretty_assertions::assert_eq;

    #[test]
    fn trim_keeps_head_and_tail_and_says_how_much_was_cut() {
        assert_eq!(trim("short", 10), "short");
        let text: String = (0..100)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let trimmed = trim(&text, 20);
        assert_eq!(
            trimmed,
            format!("{}\n[… 80 of 100 bytes cut …]\n{}", &text[..8], &text[88..])
        );
        // Multi-byte characters are never split.
        let wide = "é".repeat(50);
        let trimmed = trim(&wide, 11);
        assert!(trimmed.contains("bytes cut"), "{trimmed}");
    }

    #[test]
    fn describe_prints_what_the_seed_prints() {
        let content = "x".repeat(157);
        assert_eq!(
            describe(WRITE_FILE, &json!({"path": "fib.py", "content": content})),
            "write_file: fib.py (157 bytes)"
        );
        assert_eq!(
            describe(RUN_COMMAND, &json!({"command": "python3 fib.py"})),
            "run_command: python3 fib.py"
        );
        assert_eq!(describe("rm_rf", &json!({})), "rm_rf (unknown tool)");
    }

    #[tokio::test]
    async fn tools_use_the_sandbox_and_report_failures_as_errors() {
        let limits = ToolLimits::default();
        let sandbox = FakeSandbox::new()
            .with_file("data/big.txt", "y".repeat(40_000))
            .with_result(
                "python3 fib.py",
                ExecutionResult::ok("[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"),
            )
            .with_result("false", ExecutionResult::failed(1, "nope\n"));
        let written = execute(
            &sandbox,
            WRITE_FILE,
            &json!({"path": "fib.py", "content": "print(1)"}),
            &limits,
        )
        .await;
        assert_eq!(written, ToolOutcome::ok("wrote 8 bytes to fib.py"));
        assert_eq!(sandbox.file("fib.py").unwrap(), "print(1)");

        let ran = execute(
            &sandbox,
            RUN_COMMAND,
            &json!({"command": "python3 fib.py"}),
            &limits,
        )
        .await;
        assert_eq!(
            ran,
            ToolOutcome::ok("exit code: 0\nstdout:\n[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n")
        );
        let failed = execute(&sandbox, RUN_COMMAND, &json!({"command": "false"}), &limits).await;
        assert_eq!(failed, ToolOutcome::ok("exit code: 1\nstderr:\nnope\n"));

        let read = execute(
            &sandbox,
            READ_FILE,
            &json!({"path": "data/big.txt"}),
            &limits,
        )
        .await;
        assert!(!read.is_error);
        assert!(
            read.content.contains("of 40000 bytes cut"),
            "{}",
            read.content
        );

        let listed = execute(&sandbox, LIST_FILES, &json!({"recursive": true}), &limits).await;
        assert_eq!(
            listed,
            ToolOutcome::ok("data/\nfib.py  8 bytes\ndata/big.txt  40000 bytes")
        );

        let missing = execute(&sandbox, READ_FILE, &json!({"path": "nope.txt"}), &limits).await;
        assert!(missing.is_error);
        assert!(
            missing.content.starts_with("failed to read nope.txt"),
            "{}",
            missing.content
        );

        let invalid = execute(&sandbox, WRITE_FILE, &json!({"path": "x"}), &limits).await;
        assert_eq!(
            invalid,
            ToolOutcome::error(
                "invalid input for write_file: the string field `content` is required"
            )
        );
        let unknown = execute(&sandbox, "delete_everything", &json!({}), &limits).await;
        assert!(unknown.is_error);
    }
}

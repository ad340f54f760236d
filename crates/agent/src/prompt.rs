//! The system prompt: where the model works (directory, user), how commands run (a real shell),
//! and what the tools do, so that it does not spend a round trip finding out.

use agent_sandbox::{ExecOptions, SandboxHandle};

/// What the model is told about its sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Environment {
    /// The working directory commands start in and file paths are relative to.
    pub workdir: String,
    /// The numeric user id commands run as.
    pub uid: String,
    /// The user name, when it has one.
    pub user: Option<String>,
}

impl Default for Environment {
    /// What the runtime uses in a cluster: `/app`, as the template's non-root user 1000.
    fn default() -> Self {
        Self {
            workdir: "/app".to_owned(),
            uid: "1000".to_owned(),
            user: None,
        }
    }
}

/// The probe run once before the loop (one command, no model round trip).
pub const PROBE: &str = "pwd; id -u; id -un 2>/dev/null || true";

/// Parses the probe's output (sans IO); `None` when it is not what the probe prints.
pub fn parse_probe(stdout: &str) -> Option<Environment> {
    let mut lines = stdout.lines().map(str::trim);
    let workdir = lines.next().filter(|l| l.starts_with('/'))?.to_owned();
    let uid = lines
        .next()
        .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))?
        .to_owned();
    let user = lines.next().filter(|l| !l.is_empty()).map(str::to_owned);
    Some(Environment { workdir, uid, user })
}

/// Asks the sandbox where and as whom commands run; falls back to the cluster defaults.
pub async fn probe<H: SandboxHandle>(sandbox: &H) -> Environment {
    match sandbox.run_with(ExecOptions::shell(PROBE)).await {
        Ok(result) if result.success() => parse_probe(&result.stdout).unwrap_or_default(),
        Ok(result) => {
            tracing::debug!(exit_code = result.exit_code, "environment probe failed");
            Environment::default()
        }
        Err(error) => {
            tracing::debug!(%error, "environment probe failed");
            Environment::default()
        }
    }
}

/// The system prompt for `environment` (sans IO).
pub fn system_prompt(environment: &Environment) -> String {
    let user = match &environment.user {
        Some(name) => format!("user {name} (uid {})", environment.uid),
        None => format!("uid {}", environment.uid),
    };
    let root_note = if environment.uid == "0" {
        ""
    } else {
        " You are not root: do not use sudo or apt-get; install Python packages with \
         `pip install --user` if the network allows it."
    };
    format!(
        "You are a coding agent. Every tool call runs inside an isolated sandbox (a Kubernetes \
pod), never on the user's machine; nothing in the sandbox is secret and nothing outside it is \
reachable through it.

The sandbox:
- Working directory: {workdir}. Commands start there; file paths given to tools are relative \
to it (absolute paths must stay inside it). Files persist between tool calls.
- Commands run as {user}.{root_note}
- run_command runs the command line with /bin/sh -c, so pipes, &&, redirects, $VARS, globs and \
cd work as in a terminal; each call starts a new shell in {workdir} (cd does not persist). \
There is no TTY and no standard input: do not start interactive programs or editors. Long \
output is cut in the middle with a marker; redirect it to a file and read parts of it when you \
need all of it.
- write_file creates parent directories; prefer it over shell heredocs for files.
- Outbound network access may be blocked by policy.

Work in small verified steps: write the file, run it, read the output, and fix what failed. \
When you are done, answer the user concisely with what you did and the result; quote the \
relevant output.",
        workdir = environment.workdir,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn probe_output_is_parsed_or_rejected() {
        assert_eq!(
            parse_probe("/app\n1000\nsandbox\n"),
            Some(Environment {
                workdir: "/app".into(),
                uid: "1000".into(),
                user: Some("sandbox".into())
            })
        );
        assert_eq!(parse_probe("/tmp/pod/app\n1000\n").unwrap().user, None);
        assert_eq!(parse_probe("sh: pwd: not found\n"), None);
        assert_eq!(parse_probe("/app\nroot\n"), None);
    }

    #[test]
    fn prompt_states_directory_user_and_shell_rules() {
        let prompt = system_prompt(&Environment::default());
        assert!(prompt.contains("Working directory: /app"));
        assert!(prompt.contains("uid 1000"));
        assert!(prompt.contains("/bin/sh -c"));
        assert!(prompt.contains("not root"));
    }
}

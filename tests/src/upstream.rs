//! Upstream's own clients as the scenarios `upstream::*` run them: the Go SDK's smoke test
//! (`tests/upstream/go`, built with `go test -c`) and the Python SDK's (`tests/upstream/python`,
//! in a virtualenv that its `run.sh --prepare` makes). Both need the Go module proxy or PyPI,
//! which a run in its own network namespace cannot reach, so [`prepare`] runs first, outside
//! it, and hands the results on through the environment ([`prepared_env`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The Go smoke test's binary, or `unavailable: <reason>`.
const GO_ENV: &str = "AGENT_SANDBOX_E2E_UPSTREAM_GO";
/// The Python smoke test's interpreter (of its virtualenv), or `unavailable: <reason>`.
const PYTHON_ENV: &str = "AGENT_SANDBOX_E2E_UPSTREAM_PYTHON";
const UNAVAILABLE: &str = "unavailable: ";

/// What [`prepare`] made: a path, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The Go smoke test's binary.
    pub go: Result<PathBuf, String>,
    /// The Python smoke test's interpreter.
    pub python: Result<PathBuf, String>,
}

static PREPARED: OnceLock<Prepared> = OnceLock::new();

/// The directory of upstream's clients in this checkout.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream")
}

/// Where the builds go: `upstream-sdk/` in the target directory of the running binary
/// (`<target>/<profile>/deps/<binary>`), else in the source tree's `target/`.
fn build_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            let profile = if deps.ends_with("deps") {
                deps.parent()?
            } else {
                deps
            };
            Some(profile.join("upstream-sdk"))
        })
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
                .join("upstream-sdk")
        })
}

fn run(what: &str, command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{what}: cannot run {:?}: {error}", command.get_program()))?;
    if output.status.success() {
        Ok(())
    } else {
        let tail = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            output.status,
            tail(&output.stdout),
            tail(&output.stderr)
        ))
    }
}

fn build_go(dir: &Path) -> Result<PathBuf, String> {
    let binary = dir.join("go-sdk-smoke.test");
    let source = source_dir().join("go");
    if !source.join("go.mod").is_file() {
        return Err(format!("{} has no go.mod", source.display()));
    }
    run(
        "building upstream's Go SDK smoke test (go test -c in tests/upstream/go)",
        Command::new("go")
            .args(["test", "-c", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(&source)
            .env("GOFLAGS", "-mod=readonly"),
    )?;
    Ok(binary)
}

fn build_python(dir: &Path) -> Result<PathBuf, String> {
    let venv = dir.join("python-venv");
    run(
        "preparing upstream's Python SDK (tests/upstream/python/run.sh --prepare)",
        Command::new("bash")
            .arg(source_dir().join("python").join("run.sh"))
            .arg("--prepare")
            .env("VENV_DIR", &venv),
    )?;
    Ok(venv.join("bin").join("python"))
}

fn from_env(name: &str) -> Option<Result<PathBuf, String>> {
    let value = std::env::var(name).ok()?;
    Some(match value.strip_prefix(UNAVAILABLE) {
        Some(reason) => Err(reason.to_owned()),
        None => Ok(PathBuf::from(value)),
    })
}

/// Builds both smoke tests (once per process; the Go build cache and the reused virtualenv
/// make later runs quick), unless the environment already says what an outer run prepared.
/// Progress goes to stderr.
pub fn prepare() -> &'static Prepared {
    PREPARED.get_or_init(|| {
        if let (Some(go), Some(python)) = (from_env(GO_ENV), from_env(PYTHON_ENV)) {
            return Prepared { go, python };
        }
        let dir = build_dir();
        if let Err(error) = std::fs::create_dir_all(&dir) {
            let reason = format!("cannot create {}: {error}", dir.display());
            return Prepared {
                go: Err(reason.clone()),
                python: Err(reason),
            };
        }
        eprintln!(
            "e2e: building upstream's clients' smoke tests (Go SDK, Python SDK) into {} ...",
            dir.display()
        );
        Prepared {
            go: build_go(&dir),
            python: build_python(&dir),
        }
    })
}

/// What [`prepare`] made (preparing now if nothing did).
pub fn prepared() -> &'static Prepared {
    prepare()
}

/// [`prepare`]'s results as environment variables, for a run in its own network namespace.
pub fn prepared_env() -> Vec<(&'static str, String)> {
    let prepared = prepare();
    let value = |result: &Result<PathBuf, String>| match result {
        Ok(path) => path.display().to_string(),
        Err(reason) => format!("{UNAVAILABLE}{reason}"),
    };
    vec![
        (GO_ENV, value(&prepared.go)),
        (PYTHON_ENV, value(&prepared.python)),
    ]
}

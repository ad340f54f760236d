//! `pod-sandbox`: the kubelet's hands inside a pod's namespaces. The process kubelet embeds this
//! program (`build.rs` compiles it with `rustc` and `std` alone, `crate::process` runs it from a
//! sealed memfd), because it must exist wherever the kubelet library is linked (`sandboxctl`,
//! `sandbox-agent`, the sim, test binaries) and because a namespace of one's own is made by a
//! process with one thread, which the kubelet is not.
//!
//! - `pod-sandbox pod FD`: holds a pod's sandbox ([`pod`]);
//! - `pod-sandbox container FD`: starts and supervises one confined container ([`container`]);
//! - `pod-sandbox enter FD`: runs a command in a running container ([`enter`]);
//! - `pod-sandbox supervise PROGRAM [ARGS...]`: runs a program unconfined (`--isolation none`)
//!   under the same supervision ([`supervise`]).
//!
//! FD is a descriptor the kubelet leaves open, holding the [`spec`] in its text form.

// The C library calls in `sys` have no safe wrapper in std, and this program may use nothing
// but std; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code)]

mod container;
mod enter;
mod pod;
// Shared with the kubelet, which writes what this program reads.
#[allow(dead_code)]
mod spec;
mod supervise;
mod sys;

use std::io::Read as _;
use std::os::fd::FromRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode, Stdio};

/// A failed step: what failed, and the exit code to report it with.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) what: String,
    pub(crate) code: u8,
}

impl Step {
    pub(crate) fn message(what: String) -> Self {
        Self {
            what,
            code: supervise::FAILED,
        }
    }

    /// An error mapper naming the step.
    pub(crate) fn new(step: &'static str) -> impl Fn(std::io::Error) -> Self {
        move |error| Self::message(format!("{step} failed: {error}"))
    }

    /// [`Step::new`] with a step named at run time.
    pub(crate) fn with(step: String) -> impl Fn(std::io::Error) -> Self {
        move |error| Self::message(format!("{step} failed: {error}"))
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// Reports `error` on standard error and returns its exit code.
pub(crate) fn fail(error: &Step) -> ExitCode {
    eprintln!("pod-sandbox: {error}");
    ExitCode::from(error.code)
}

/// Joins the namespaces in order (each descriptor is closed once joined).
pub(crate) fn join(namespaces: &[(spec::Namespace, i32)]) -> Result<(), Step> {
    for (namespace, fd) in namespaces {
        sys::setns(*fd, namespace.flag())
            .map_err(Step::with(format!("joining the {namespace:?} namespace")))?;
    }
    for (_, fd) in namespaces {
        // SAFETY: the kubelet left these descriptors open for this process alone; each is
        // closed once, here (a descriptor named twice is joined twice and closed once).
        drop(unsafe { std::fs::File::from_raw_fd(*fd) });
    }
    Ok(())
}

/// Reads the spec from descriptor `arg`.
fn read_spec(arg: Option<String>) -> Result<String, Step> {
    let fd: i32 = arg
        .as_deref()
        .and_then(|fd| fd.parse().ok())
        .ok_or_else(|| Step::message(format!("expected a descriptor, got {arg:?}")))?;
    // SAFETY: the kubelet leaves this descriptor open for this process alone; it is read and
    // closed here, once.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(Step::new("reading the spec"))?;
    Ok(text)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let result = match mode.as_str() {
        "pod" => read_spec(args.next())
            .and_then(|text| spec::Pod::decode(&text).map_err(Step::message))
            .map(|spec| pod::run(&spec)),
        "container" => read_spec(args.next())
            .and_then(|text| spec::Container::decode(&text).map_err(Step::message))
            .map(|spec| container::run(&spec)),
        "enter" => read_spec(args.next())
            .and_then(|text| spec::Enter::decode(&text).map_err(Step::message))
            .map(|spec| enter::run(&spec)),
        "supervise" => Ok(plain(std::env::args_os().skip(2).collect())),
        _ => Err(Step::message(
            "usage: pod-sandbox pod FD | container FD | enter FD | supervise PROGRAM [ARGS...]"
                .to_owned(),
        )),
    };
    result.unwrap_or_else(|error| fail(&error))
}

/// `supervise`: runs `argv` as a child subreaper's child, unconfined.
fn plain(argv: Vec<std::ffi::OsString>) -> ExitCode {
    let Some((program, args)) = argv.split_first() else {
        return fail(&Step::message("supervise: no program".to_owned()));
    };
    if let Err(error) = sys::prctl(sys::PR_SET_CHILD_SUBREAPER, 1) {
        return fail(&Step::message(format!(
            "cannot become a child subreaper: {error}"
        )));
    }
    let watcher = supervise::Watcher::start();
    supervise::set_signals(sys::SIG_IGN);
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    // SAFETY: the closure runs between fork and exec and only calls signal(2) (see
    // `set_signals`), so that the program starts with the default dispositions instead of ours.
    unsafe {
        command.pre_exec(|| {
            supervise::set_signals(sys::SIG_DFL);
            Ok(())
        });
    }
    match command.spawn() {
        Ok(child) => match i32::try_from(child.id()) {
            Ok(pid) => watcher.supervise(pid),
            Err(_) => ExitCode::from(supervise::FAILED),
        },
        Err(error) => {
            eprintln!("pod-sandbox: failed to start {program:?}: {error}");
            // As a shell reports it: 127 not found, 126 found but not executable.
            let code = match error.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            ExitCode::from(code)
        }
    }
}

//! `pod-sandbox enter FD`: runs a command inside a running container (an exec probe), as
//! `nsenter` would but with the container's restrictions: it joins the pod's and the
//! container's namespaces (its PID namespace too, which the child lands in), becomes the
//! container's user, and the child drops every capability, sets `no_new_privs`, applies the
//! seccomp filter and runs the command in the container's working directory. The helper waits
//! for it and exits as it did.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitCode, ExitStatus};

use crate::spec::Enter;
use crate::{Step, fail, join, sys};

pub(crate) fn run(spec: &Enter) -> ExitCode {
    if let Err(error) = prepare(spec) {
        return fail(&error);
    }
    let (lifeline, lifeline_end) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(error) => return fail(&Step::message(format!("a pipe: {error}"))),
    };
    let child = match sys::fork() {
        Ok(pid) => pid,
        Err(error) => return fail(&Step::message(format!("forking: {error}"))),
    };
    if child == 0 {
        drop(lifeline_end);
        let error = match start(spec, &lifeline) {
            Ok(never) => match never {},
            Err(error) => error,
        };
        eprintln!("pod-sandbox: {error}");
        std::process::exit(error.code.into());
    }
    drop(lifeline);
    crate::supervise::set_signals(sys::SIG_IGN);
    loop {
        match sys::waitpid(child, 0) {
            Ok((_, status)) => return crate::supervise::exit_like(ExitStatus::from_raw(status)),
            Err(error) if error.raw_os_error() == Some(sys::EINTR) => {}
            Err(error) => return fail(&Step::message(format!("waiting for the command: {error}"))),
        }
    }
}

fn prepare(spec: &Enter) -> Result<(), Step> {
    if !spec.groups.is_empty() {
        sys::setgroups(&spec.groups).map_err(Step::new("taking the pod's groups"))?;
    }
    join(&spec.join)?;
    sys::set_ids(spec.uid, spec.gid).map_err(Step::with(format!(
        "becoming user {}:{} in the pod",
        spec.uid, spec.gid
    )))
}

fn start(spec: &Enter, lifeline: &std::io::PipeReader) -> Result<std::convert::Infallible, Step> {
    if !sys::die_with_parent(lifeline).map_err(Step::new("setting PDEATHSIG"))? {
        std::process::exit(crate::supervise::FAILED.into());
    }
    crate::supervise::set_signals(sys::SIG_DFL);
    std::env::set_current_dir(&spec.workdir).map_err(Step::with(format!(
        "entering the working directory {}",
        spec.workdir
    )))?;
    crate::container::restrict(spec.seccomp.as_deref())?;
    crate::container::exec(&spec.argv)
}

//! Commands that work inside sandboxes, through the SDK (`agent_sandbox`): `run` (also
//! `--local`), `claim`, `exec`, `cp`, `ls`, `cat`, `rm`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox::args::ConnectArgs;
use agent_sandbox::{
    Client, CreateOptions, ExecCommand, ExecEvent, ExecOptions, FileType, Progress, Sandbox,
};
use agent_sandbox_local::{LocalCluster, LocalConfig};
use serde::Serialize;
use tokio::io::AsyncWriteExt as _;

use super::pools::ensure_pool;
use super::{interrupted, io, print, render, sdk};
use crate::cli::{ClaimArgs, CommandArgs, CpArgs, ExecArgs, LsArgs, RmArgs, RunArgs};
use crate::error::{Error, Result};
use crate::output::{self, Format};
use crate::spinner::Spinner;

/// Exit code after Ctrl-C (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: i32 = 130;
/// Exit code when the command was killed by its timeout (as `timeout(1)`).
pub const EXIT_TIMED_OUT: i32 = 124;

/// A connected handle to `claim`'s sandbox (with a signing key, the SDK mints a scoped token
/// for it per request).
async fn attach(client: &Client, claim: &str) -> Result<Sandbox> {
    match client.get_sandbox(claim).await {
        Ok(sandbox) => Ok(sandbox),
        Err(error) if error.is_not_found() => Err(Error::ClaimNotFound {
            namespace: client.namespace().to_owned(),
            claim: claim.to_owned(),
        }),
        Err(error) => Err(sdk(format!("connect to the sandbox of claim {claim}"))(
            error,
        )),
    }
}

/// Claims a sandbox from `pool`, with a spinner; Ctrl-C meanwhile deletes the claim. Returns
/// `None` when interrupted.
async fn claim_sandbox(
    client: &Client,
    pool: &str,
    ttl: Option<Duration>,
    wait_timeout: Duration,
) -> Result<Option<(Sandbox, Duration)>> {
    ensure_pool(client, pool).await?;
    let spinner = Arc::new(Spinner::start(format!(
        "claiming a sandbox from pool {pool}"
    )));
    let created: Arc<Mutex<Option<String>>> = Arc::default();
    let mut options = CreateOptions::default().ready_timeout(wait_timeout);
    // `--ttl 0` opts out of the expiry.
    if let Some(ttl) = ttl.filter(|t| !t.is_zero()) {
        options = options.shutdown_after(ttl);
    }
    let options = {
        let spinner = spinner.clone();
        let created = created.clone();
        let pool = pool.to_owned();
        options.on_progress(move |step| match step {
            Progress::ClaimCreated { claim } => {
                if let Ok(mut c) = created.lock() {
                    *c = Some(claim.clone());
                }
                spinner.set_message(format!("claim {claim}: waiting for a sandbox from {pool}"));
            }
            Progress::Waiting { reason, .. } => {
                spinner.set_message(format!("waiting for a sandbox from {pool}: {reason}"));
            }
            Progress::SandboxAssigned { sandbox } => {
                spinner.set_message(format!("got sandbox {sandbox}; waiting until Ready"));
            }
            Progress::Connecting => spinner.set_message("connecting to the router"),
            _ => {}
        })
    };
    let started = Instant::now();
    let outcome = tokio::select! {
        created = client.create_sandbox_with(pool, options) => Some(created),
        () = interrupted() => None,
    };
    spinner.set_message("");
    drop(spinner);
    let Some(outcome) = outcome else {
        let name = created.lock().ok().and_then(|c| c.clone());
        if let Some(name) = name {
            eprintln!("interrupted: deleting claim {name}");
            client
                .delete(&name)
                .await
                .map_err(sdk(format!("delete claim {name}")))?;
        }
        return Ok(None);
    };
    let sandbox = outcome.map_err(sdk(format!("claim a sandbox from pool {pool}")))?;
    Ok(Some((sandbox, started.elapsed())))
}

/// The shell line for the words after `--`: one word is a shell line as written (`'echo $HOME
/// | wc -c'`); several words are a program and its arguments, each quoted, so that
/// `python3 -c 'print(6*7)'` means what it means in a local shell.
pub fn shell_line(words: &[String]) -> String {
    match words {
        [line] => line.clone(),
        words => ExecCommand::Argv(words.to_vec()).to_line(),
    }
}

fn exec_options(args: &CommandArgs) -> Result<ExecOptions> {
    let mut options = if args.no_shell {
        ExecOptions::argv(args.command.clone())
    } else {
        ExecOptions::shell(shell_line(&args.command))
    };
    if let Some(timeout) = args.timeout {
        options = options.timeout(timeout);
    }
    if let Some(cwd) = &args.cwd {
        options = options.cwd(cwd.clone());
    }
    for pair in &args.env {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Error::Usage(format!("--env takes KEY=VALUE, not {pair:?}")));
        };
        options = options.env(key, value);
    }
    if args.stdin {
        let mut input = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut input)
            .map_err(io("read standard input"))?;
        options = options.stdin(stdin_text(input)?);
    }
    Ok(options)
}

/// Standard input for `--stdin`, which the runtime takes as text: bytes that are not UTF-8
/// are refused rather than silently replaced.
fn stdin_text(input: Vec<u8>) -> Result<String> {
    String::from_utf8(input).map_err(|e| {
        Error::Usage(format!(
            "--stdin sends text, and standard input is not UTF-8 (invalid byte at offset {}); \
             for binary data copy it in first (`sandboxctl cp - CLAIM:input.bin`) and read \
             the file in the command",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// How a streamed command ended.
#[derive(Debug)]
enum Ended {
    Exited(i32),
    Interrupted,
}

/// Streams the command's output to stdout/stderr as it is produced and returns its exit code
/// (128 + signal when killed, 124 on timeout). Ctrl-C stops waiting (the runtime kills the
/// command when the connection closes).
async fn stream(sandbox: &Sandbox, options: ExecOptions) -> Result<Ended> {
    let mut events = sandbox.exec_stream(options).await.map_err(sdk(format!(
        "run the command in sandbox {}",
        sandbox.sandbox_name()
    )))?;
    loop {
        let event = tokio::select! {
            event = events.next_event() => event,
            () = interrupted() => return Ok(Ended::Interrupted),
        };
        let Some(event) = event else {
            return Err(Error::Usage(format!(
                "the output stream of sandbox {} ended without an exit status",
                sandbox.sandbox_name()
            )));
        };
        match event.map_err(sdk("read the command's output"))? {
            ExecEvent::Stdout(chunk) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&chunk.bytes().unwrap_or_default());
                let _ = out.flush();
            }
            ExecEvent::Stderr(chunk) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&chunk.bytes().unwrap_or_default());
                let _ = err.flush();
            }
            ExecEvent::Exit(exit) => {
                if exit.stdout_truncated || exit.stderr_truncated {
                    eprintln!("sandboxctl: output was truncated by the runtime's limit");
                }
                if exit.timed_out {
                    eprintln!("sandboxctl: the command timed out and was killed");
                    return Ok(Ended::Exited(EXIT_TIMED_OUT));
                }
                return Ok(Ended::Exited(match (exit.exit_code, exit.signal) {
                    (Some(code), _) => code,
                    (None, Some(signal)) => 128 + signal,
                    (None, None) => 1,
                }));
            }
            _ => {}
        }
    }
}

fn millis(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Claim, run, delete: the body of `run` on any cluster.
async fn claim_run_delete(client: &Client, args: &RunArgs) -> Result<i32> {
    let options = exec_options(&args.command)?;
    let Some((sandbox, claimed_in)) =
        claim_sandbox(client, &args.pool, Some(args.ttl), args.wait_timeout).await?
    else {
        return Ok(EXIT_INTERRUPTED);
    };
    eprintln!(
        "sandboxctl: claimed {} (sandbox {}, pool {}) in {}",
        sandbox.claim_name(),
        sandbox.sandbox_name(),
        args.pool,
        millis(claimed_in)
    );
    let started = Instant::now();
    let ended = stream(&sandbox, options).await;
    let ran_in = started.elapsed();
    let closed = sandbox.close().await;
    let code = match ended? {
        Ended::Exited(code) => {
            eprintln!("sandboxctl: exit code {code}, ran in {}", millis(ran_in));
            code
        }
        Ended::Interrupted => {
            eprintln!(
                "sandboxctl: interrupted; deleted claim {}",
                sandbox.claim_name()
            );
            EXIT_INTERRUPTED
        }
    };
    closed.map_err(sdk(format!("delete claim {}", sandbox.claim_name())))?;
    Ok(code)
}

/// `sandboxctl run` against the current cluster.
pub async fn run(client: &Client, args: RunArgs) -> Result<i32> {
    claim_run_delete(client, &args).await
}

/// `sandboxctl run --local`: a local cluster in this process for one command.
pub async fn run_local(global: &ConnectArgs, args: RunArgs) -> Result<i32> {
    let started = Instant::now();
    let spinner = Spinner::start("starting a local cluster");
    let config = LocalConfig {
        isolation: args.isolation,
        networks: args.network,
        pool_replicas: 1,
        ..LocalConfig::default()
    };
    let started_cluster = tokio::select! {
        local = LocalCluster::start(config) => Some(local),
        () = interrupted() => None,
    };
    let Some(local) = started_cluster else {
        return Ok(EXIT_INTERRUPTED);
    };
    let local = local.map_err(|source| Error::Local { source })?;
    spinner.set_message("warming a sandbox");
    let warmed = tokio::select! {
        warmed = local.wait_for_pool(1, args.wait_timeout, |_, _| {}) => Some(warmed),
        () = interrupted() => None,
    };
    spinner.finish();
    let Some(warmed) = warmed else {
        local.stop().await;
        return Ok(EXIT_INTERRUPTED);
    };
    warmed.map_err(|source| Error::Local { source })?;
    eprintln!(
        "sandboxctl: local cluster up with a warm sandbox in {}",
        millis(started.elapsed())
    );
    for note in local.startup_notes() {
        eprintln!("sandboxctl: {note}");
    }
    let mut global = global.clone();
    global.router_url = local.router_url().map(str::to_owned);
    global.router_token = local.router_token();
    global.signing_key_file = None;
    let options = global
        .client_options(agent_sandbox_local::DEFAULT_NAMESPACE)
        .map_err(Error::connect)?;
    let client = Client::from_kube(local.client(), options);
    let code = claim_run_delete(&client, &args).await;
    local.stop().await;
    code
}

/// What `claim -o json|yaml` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Claimed {
    namespace: String,
    claim: String,
    sandbox: String,
    pod: String,
    pod_ip: Option<String>,
    claim_latency_ms: u128,
    /// RFC 3339; absent when the claim never expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires: Option<String>,
}

/// The stderr line that says when a new claim expires and how to change that.
pub fn expiry_notice(claim: &str, expires: Option<jiff::Timestamp>, ttl: Duration) -> String {
    match expires {
        Some(at) => format!(
            "sandboxctl: claim {claim} expires at {at} (in {}); extend with `sandboxctl extend {claim} DURATION`, --ttl 0 for none",
            crate::output::duration(ttl)
        ),
        None => format!(
            "sandboxctl: claim {claim} never expires (--ttl 0); delete it with `sandboxctl delete {claim}`"
        ),
    }
}

/// `sandboxctl claim`.
pub async fn claim(client: &Client, args: ClaimArgs) -> Result<i32> {
    let Some((sandbox, claimed_in)) =
        claim_sandbox(client, &args.pool, Some(args.ttl), args.wait_timeout).await?
    else {
        return Ok(EXIT_INTERRUPTED);
    };
    // Keep the claim: this process only hands out its name.
    sandbox.disconnect().await;
    let expires = sandbox.shutdown_time();
    match args.output {
        None | Some(Format::Table) => {
            eprintln!(
                "sandboxctl: claimed {} (sandbox {}) in {}",
                sandbox.claim_name(),
                sandbox.sandbox_name(),
                millis(claimed_in)
            );
            eprintln!("{}", expiry_notice(sandbox.claim_name(), expires, args.ttl));
            print(&format!("{}\n", sandbox.claim_name()))?;
        }
        Some(format) => {
            let claimed = Claimed {
                namespace: sandbox.namespace().to_owned(),
                claim: sandbox.claim_name().to_owned(),
                sandbox: sandbox.sandbox_name().to_owned(),
                pod: sandbox.pod_name().to_owned(),
                pod_ip: sandbox.pod_ip().map(str::to_owned),
                claim_latency_ms: claimed_in.as_millis(),
                expires: expires.map(|t| t.to_string()),
            };
            eprintln!("{}", expiry_notice(sandbox.claim_name(), expires, args.ttl));
            // A table was handled above.
            print(&render(format, &claimed, String::new)?)?;
        }
    }
    Ok(0)
}

/// `sandboxctl exec`.
pub async fn exec(client: &Client, args: ExecArgs) -> Result<i32> {
    let options = exec_options(&args.command)?;
    let sandbox = attach(client, &args.claim).await?;
    match stream(&sandbox, options).await? {
        Ended::Exited(code) => Ok(code),
        Ended::Interrupted => Ok(EXIT_INTERRUPTED),
    }
}

/// One side of `cp`: a local path, `-`, or `CLAIM:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// Standard input or output.
    Std,
    /// A local path.
    Local(PathBuf),
    /// A path in a claim's sandbox.
    Remote {
        /// The claim.
        claim: String,
        /// The path (relative to the sandbox's base directory; empty for the base).
        path: String,
    },
}

/// Parses a `cp` operand: `CLAIM:path` when the part before the first `:` is a DNS label (so
/// `./a:b` and `/tmp/x:y` stay local), `-` for standard input/output, a local path otherwise.
pub fn parse_location(text: &str) -> Location {
    if text == "-" {
        return Location::Std;
    }
    if let Some((claim, path)) = text.split_once(':')
        && agent_sandbox_api::names::is_dns_label(claim)
    {
        return Location::Remote {
            claim: claim.to_owned(),
            path: path.to_owned(),
        };
    }
    Location::Local(PathBuf::from(text))
}

/// `CLAIM` or `CLAIM:path` for `ls`, `cat`, `rm`.
fn remote(text: &str) -> Result<(String, String)> {
    match parse_location(text) {
        Location::Remote { claim, path } => Ok((claim, path)),
        _ if agent_sandbox_api::names::is_dns_label(text) => Ok((text.to_owned(), String::new())),
        _ => Err(Error::Usage(format!(
            "expected CLAIM or CLAIM:path, not {text:?}"
        ))),
    }
}

fn join(dir: &str, name: &str) -> String {
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() || dir == "." {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The type of `path` in the sandbox (`None` when it does not exist).
async fn remote_type(sandbox: &Sandbox, path: &str) -> Result<Option<FileType>> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() || trimmed == "." {
        return Ok(Some(FileType::Directory));
    }
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    match sandbox.list(parent).await {
        Ok(entries) => Ok(entries
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| e.file_type)),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(sdk(format!("list {parent:?}"))(error)),
    }
}

/// Uploads a local file or directory tree to `dst`.
async fn upload(sandbox: &Sandbox, src: &Path, dst: &str) -> Result<u64> {
    let meta = tokio::fs::metadata(src)
        .await
        .map_err(|source| Error::File {
            action: "read",
            path: src.to_path_buf(),
            source,
        })?;
    if !meta.is_dir() {
        sandbox
            .upload_file(dst, src)
            .await
            .map_err(sdk(format!("upload {} to {dst}", src.display())))?;
        return Ok(1);
    }
    sandbox
        .mkdir(dst)
        .await
        .map_err(sdk(format!("create directory {dst}")))?;
    let mut files = 0;
    let mut pending = vec![(src.to_path_buf(), dst.to_owned())];
    while let Some((dir, remote_dir)) = pending.pop() {
        let read_err = |source| Error::File {
            action: "list",
            path: dir.clone(),
            source,
        };
        let mut entries = tokio::fs::read_dir(&dir).await.map_err(read_err)?;
        while let Some(entry) = entries.next_entry().await.map_err(read_err)? {
            let name = entry.file_name().to_string_lossy().into_owned();
            let target = join(&remote_dir, &name);
            let kind = entry.file_type().await.map_err(read_err)?;
            if kind.is_dir() {
                sandbox
                    .mkdir(&target)
                    .await
                    .map_err(sdk(format!("create directory {target}")))?;
                pending.push((entry.path(), target));
            } else if kind.is_file() {
                sandbox
                    .upload_file(&target, entry.path())
                    .await
                    .map_err(sdk(format!(
                        "upload {} to {target}",
                        entry.path().display()
                    )))?;
                files += 1;
            } else {
                eprintln!(
                    "sandboxctl: skipping {} (not a file or directory)",
                    entry.path().display()
                );
            }
        }
    }
    Ok(files)
}

/// Downloads one remote file to a local path (or stdout for `None`).
async fn download_file(sandbox: &Sandbox, src: &str, dst: Option<&Path>) -> Result<()> {
    let mut reader = sandbox
        .download(src)
        .await
        .map_err(sdk(format!("download {src}")))?;
    match dst {
        None => {
            let mut out = tokio::io::stdout();
            tokio::io::copy(&mut reader, &mut out)
                .await
                .map_err(io(&format!("copy {src} to stdout")))?;
            out.flush().await.map_err(io("flush stdout"))?;
        }
        Some(path) => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|source| Error::File {
                        action: "create",
                        path: parent.to_path_buf(),
                        source,
                    })?;
            }
            let write_err = |source| Error::File {
                action: "write",
                path: path.to_path_buf(),
                source,
            };
            let mut file = tokio::fs::File::create(path).await.map_err(write_err)?;
            tokio::io::copy(&mut reader, &mut file)
                .await
                .map_err(write_err)?;
            file.flush().await.map_err(write_err)?;
        }
    }
    Ok(())
}

/// Downloads a remote directory tree to `dst` through the SDK, which keeps every name the
/// sandbox sends inside `dst` and never writes through a symlink there.
async fn download_dir(sandbox: &Sandbox, src: &str, dst: &Path) -> Result<u64> {
    let copied = sandbox
        .download_dir(src, dst)
        .await
        .map_err(sdk(format!("copy {src} to {}", dst.display())))?;
    for skipped in &copied.skipped {
        eprintln!("sandboxctl: skipping {skipped} (not a file or directory)");
    }
    Ok(copied.files)
}

fn base_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// `sandboxctl cp`.
pub async fn cp(client: &Client, args: CpArgs) -> Result<i32> {
    let src = parse_location(&args.src);
    let dst = parse_location(&args.dst);
    match (src, dst) {
        (Location::Remote { .. }, Location::Remote { .. }) => Err(Error::Usage(
            "cp copies between this machine and a sandbox; copy through a local file to go from one sandbox to another".to_owned(),
        )),
        (Location::Std | Location::Local(_), Location::Std | Location::Local(_)) => {
            Err(Error::Usage(
                "one side of cp must be CLAIM:path (e.g. sandboxctl cp ./data sandbox-claim-x7k2q:data)".to_owned(),
            ))
        }
        (Location::Std, Location::Remote { claim, path }) => {
            let sandbox = attach(client, &claim).await?;
            sandbox
                .upload(&path, tokio::io::stdin())
                .await
                .map_err(sdk(format!("upload standard input to {path}")))?;
            Ok(0)
        }
        (Location::Local(local), Location::Remote { claim, path }) => {
            let sandbox = attach(client, &claim).await?;
            let mut target = path.clone();
            let into_dir = path.is_empty()
                || path.ends_with('/')
                || remote_type(&sandbox, &path).await? == Some(FileType::Directory);
            if into_dir {
                target = join(&path, base_name(&local.to_string_lossy()));
            }
            let files = upload(&sandbox, &local, &target).await?;
            eprintln!("sandboxctl: copied {files} file(s) to {claim}:{target}");
            Ok(0)
        }
        (Location::Remote { claim, path }, Location::Std) => {
            let sandbox = attach(client, &claim).await?;
            download_file(&sandbox, &path, None).await?;
            Ok(0)
        }
        (Location::Remote { claim, path }, Location::Local(local)) => {
            // The local name comes from the normal form (`work/..` is the base directory,
            // named after the claim), never from `..` or `.`.
            let normal = agent_sandbox::normalize_path("copy", &path)
                .map_err(|e| Error::Usage(e.to_string()))?;
            let sandbox = attach(client, &claim).await?;
            let kind = remote_type(&sandbox, &normal).await?.ok_or_else(|| {
                Error::Usage(format!("{claim}:{path} does not exist"))
            })?;
            let target = if local.is_dir() {
                let name = base_name(&normal);
                local.join(if name.is_empty() { claim.as_str() } else { name })
            } else {
                local
            };
            let path = normal;
            let files = if kind == FileType::Directory {
                download_dir(&sandbox, &path, &target).await?
            } else {
                download_file(&sandbox, &path, Some(&target)).await?;
                1
            };
            eprintln!("sandboxctl: copied {files} file(s) to {}", target.display());
            Ok(0)
        }
    }
}

/// The `ls` table.
pub fn entries_table(entries: &[agent_sandbox::FileEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let kind = match e.file_type {
                FileType::Directory => "dir",
                FileType::File => "file",
                FileType::Symlink => "link",
                _ => "other",
            };
            let name = if e.file_type == FileType::Directory {
                format!("{}/", e.name)
            } else {
                e.name.clone()
            };
            vec![
                e.mode.clone(),
                kind.to_owned(),
                e.size.to_string(),
                e.modified_at.clone(),
                name,
            ]
        })
        .collect();
    output::table(&["MODE", "TYPE", "SIZE", "MODIFIED", "NAME"], &rows)
}

/// `sandboxctl ls`.
pub async fn ls(client: &Client, args: LsArgs) -> Result<i32> {
    let (claim, path) = remote(&args.target)?;
    let sandbox = attach(client, &claim).await?;
    let entries = sandbox
        .list(&path)
        .await
        .map_err(sdk(format!("list {claim}:{path}")))?;
    let text = render(args.output, &entries, || entries_table(&entries))?;
    print(&text)?;
    Ok(0)
}

/// `sandboxctl cat`.
pub async fn cat(client: &Client, args: crate::cli::PathArg) -> Result<i32> {
    let (claim, path) = remote(&args.target)?;
    let sandbox = attach(client, &claim).await?;
    download_file(&sandbox, &path, None).await?;
    Ok(0)
}

/// `sandboxctl rm`.
pub async fn rm(client: &Client, args: RmArgs) -> Result<i32> {
    let (claim, path) = remote(&args.target)?;
    // Refused here already (the SDK refuses too): nothing is sent for the base directory.
    agent_sandbox::normalize_mutable_path("remove", &path)
        .map_err(|e| Error::Usage(e.to_string()))?;
    let sandbox = attach(client, &claim).await?;
    sandbox
        .remove(&path, args.recursive)
        .await
        .map_err(sdk(format!("remove {claim}:{path}")))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn stdin_that_is_not_utf8_is_refused_naming_the_offset() {
        assert_eq!(
            stdin_text(b"print(6*7)\n".to_vec()).ok().as_deref(),
            Some("print(6*7)\n")
        );
        let message = stdin_text(b"ab\xffcd".to_vec())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("offset 2"), "{message}");
        assert!(message.contains("sandboxctl cp -"), "{message}");
    }

    #[test]
    fn cp_operands_are_remote_only_with_a_claim_name_before_the_colon() {
        assert_eq!(
            parse_location("sandbox-claim-x7k2q:work/a.txt"),
            Location::Remote {
                claim: "sandbox-claim-x7k2q".into(),
                path: "work/a.txt".into()
            }
        );
        assert_eq!(parse_location("./a:b"), Location::Local("./a:b".into()));
        assert_eq!(
            parse_location("/tmp/x:y"),
            Location::Local("/tmp/x:y".into())
        );
        assert_eq!(parse_location("-"), Location::Std);
        assert_eq!(parse_location("data"), Location::Local("data".into()));
    }

    #[test]
    fn one_word_is_a_shell_line_and_several_are_quoted_argv() {
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            shell_line(&words(&["echo $HOME | wc -c"])),
            "echo $HOME | wc -c"
        );
        assert_eq!(
            shell_line(&words(&["python3", "-c", "print(6*7)"])),
            "python3 -c 'print(6*7)'"
        );
        assert_eq!(
            shell_line(&words(&["echo", "it's", ""])),
            "echo 'it'\\''s' ''"
        );
    }

    #[test]
    fn the_expiry_notice_names_the_time_and_how_to_change_it() {
        let at: jiff::Timestamp = "2026-01-01T13:00:00Z".parse().unwrap();
        assert_eq!(
            expiry_notice("c", Some(at), Duration::from_secs(3600)),
            "sandboxctl: claim c expires at 2026-01-01T13:00:00Z (in 1h); extend with `sandboxctl extend c DURATION`, --ttl 0 for none"
        );
        assert_eq!(
            expiry_notice("c", None, Duration::ZERO),
            "sandboxctl: claim c never expires (--ttl 0); delete it with `sandboxctl delete c`"
        );
    }

    #[test]
    fn remote_paths_join_without_doubled_slashes() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("work/", "a"), "work/a");
        assert_eq!(base_name("work/dir/"), "dir");
    }
}

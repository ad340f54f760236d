//! The command line: flags, subcommands, help texts and examples (clap derive). `main.rs` parses
//! [`Cli`] and hands it to [`crate::run`].

use std::path::PathBuf;
use std::time::Duration;

use agent_sandbox::args::ConnectArgs;
use agent_sandbox_api::units::parse_duration;
use agent_sandbox_local::{Isolation, PodNetworks};
use clap::{Args, Parser, Subcommand};

use crate::output::Format;

// The environment variables of the connection flags, as the SDK's flags define them.
pub use agent_sandbox::args::{ENV_ROUTER_TOKEN, ENV_ROUTER_URL, ENV_SIGNING_KEY_FILE};

/// Lifetime of a claim made by `claim` and `run` unless `--ttl` says otherwise, so that a
/// client killed before it deletes its claim leaves nothing for ever.
pub const DEFAULT_CLAIM_TTL: &str = "1h";

/// Sandboxes for AI-agent code: a local cluster with no Docker, one-shot runs, and day-to-day
/// work with claims on any cluster.
#[derive(Debug, Parser)]
#[command(
    name = "sandboxctl",
    version,
    propagate_version = true,
    after_help = "Examples:
  sandboxctl run --local -- python3 -c 'print(6*7)'          # no cluster needed
  sandboxctl dev                                              # a local cluster until Ctrl-C
  sandboxctl run --pool python-sandbox-pool -- uname -a       # one-shot on the current cluster
  C=$(sandboxctl claim --pool python-sandbox-pool --ttl 30m) && sandboxctl exec $C -- 'echo hi from $(hostname)'

Also works as the kubectl plugin `kubectl sandbox` (install the binary as kubectl-sandbox)."
)]
pub struct Cli {
    /// Connection to the cluster and the router (the SDK's flags, shared with `sandbox-agent`).
    #[command(flatten)]
    pub global: ConnectArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a local cluster (simulated API, controller, router, a warm Python pool) until Ctrl-C.
    #[command(after_help = "Examples:
  sandboxctl dev
  sandboxctl dev --kubeconfig-out /tmp/dev.kubeconfig --replicas 4

Then, in another terminal, use the environment it prints:
  kubectl get sandboxwarmpools,sandboxes,pods
  sandboxctl claim --pool python-sandbox-pool")]
    Dev(DevArgs),
    /// Claim a sandbox, run one command in it (output streamed), delete the claim.
    #[command(after_help = "Examples:
  sandboxctl run --local -- python3 -c 'print(6*7)'
  sandboxctl run --pool python-sandbox-pool -- 'echo $((6*7)) > /tmp/x && cat /tmp/x'
  sandboxctl run --pool python-sandbox-pool --no-shell -- ls -la

The exit code is the command's. Claim and run latencies are reported on stderr;
Ctrl-C deletes the claim.")]
    Run(RunArgs),
    /// Claim a sandbox from a warm pool and print the claim's name.
    #[command(after_help = "Examples:
  sandboxctl claim --pool python-sandbox-pool             # expires in 1h unless extended
  sandboxctl claim --pool python-sandbox-pool --ttl 2h -o json
  sandboxctl claim --pool python-sandbox-pool --ttl 0     # never expires: delete it yourself

The claim's expiry is printed on stderr; `sandboxctl extend CLAIM DURATION` moves it.")]
    Claim(ClaimArgs),
    /// Run a command in a claimed sandbox (output streamed, exit code propagated).
    #[command(after_help = "Examples:
  sandboxctl exec sandbox-claim-x7k2q -- 'echo hello from $(hostname)'
  sandboxctl exec sandbox-claim-x7k2q --no-shell -- python3 -c 'print(1)'
  echo 'print(6*7)' | sandboxctl exec sandbox-claim-x7k2q --stdin -- python3")]
    Exec(ExecArgs),
    /// Copy files or directories to or from a sandbox (`CLAIM:path` on one side).
    #[command(after_help = "Examples:
  sandboxctl cp ./src sandbox-claim-x7k2q:work/src      # a directory, recursively
  sandboxctl cp sandbox-claim-x7k2q:out/report.csv .
  sandboxctl cp - sandbox-claim-x7k2q:input.txt < input.txt")]
    Cp(CpArgs),
    /// List a directory in a sandbox.
    #[command(after_help = "Examples:
  sandboxctl ls sandbox-claim-x7k2q
  sandboxctl ls sandbox-claim-x7k2q:work -o json")]
    Ls(LsArgs),
    /// Print a file from a sandbox.
    #[command(after_help = "Examples:
  sandboxctl cat sandbox-claim-x7k2q:out/result.json")]
    Cat(PathArg),
    /// Remove a file or directory in a sandbox.
    #[command(after_help = "Examples:
  sandboxctl rm sandbox-claim-x7k2q:notes.txt
  sandboxctl rm -r sandbox-claim-x7k2q:tmp/scratch")]
    Rm(RmArgs),
    /// List claims with their sandbox, pod, age, readiness and expiry.
    #[command(after_help = "Examples:
  sandboxctl list
  sandboxctl list -n team-a -o yaml")]
    List(ListArgs),
    /// Delete claims (and so their sandboxes).
    #[command(after_help = "Examples:
  sandboxctl delete sandbox-claim-x7k2q
  sandboxctl delete --all -n scratch")]
    Delete(DeleteArgs),
    /// Move a claim's expiry to now + DURATION (the sandbox is deleted then).
    #[command(after_help = "Examples:
  sandboxctl extend sandbox-claim-x7k2q 1h")]
    Extend(ExtendArgs),
    /// Suspend a claim's sandbox: its pod goes, its files on volumes and its Service stay.
    #[command(after_help = "Examples:
  sandboxctl suspend sandbox-claim-x7k2q
  sandboxctl exec sandbox-claim-x7k2q -- 'echo back'   # a request wakes it (held until Ready)")]
    Suspend(ClaimArg),
    /// Resume a claim's suspended sandbox (its pod comes back).
    #[command(after_help = "Examples:
  sandboxctl resume sandbox-claim-x7k2q")]
    Resume(ClaimArg),
    /// List warm pools with desired and ready sandboxes.
    #[command(after_help = "Examples:
  sandboxctl pools
  sandboxctl pools -A -o json")]
    Pools(PoolsArgs),
    /// Print the logs of a claim's sandbox pod.
    #[command(after_help = "Examples:
  sandboxctl logs sandbox-claim-x7k2q
  sandboxctl logs sandbox-claim-x7k2q --follow")]
    Logs(LogsArgs),
    /// Mint a scoped router token for a claim's sandbox (needs the signing key).
    #[command(after_help = "Examples:
  sandboxctl token sandbox-claim-x7k2q --signing-key-file key --ttl 1h
  curl -H \"Authorization: Bearer $(sandboxctl token $C)\" -H 'X-Sandbox-ID: ...' $ROUTER/")]
    Token(TokenArgs),
    /// Serve the sandbox tools to an MCP client (Claude Code, Claude Desktop, ...): stdio by
    /// default, streamable HTTP with --listen.
    #[command(after_help = "Examples:
  sandboxctl mcp --local                              # stdio, on a local cluster started for it
  sandboxctl mcp -n team-a                            # stdio, on the current cluster's team-a
  sandboxctl mcp --local --listen                     # HTTP at http://127.0.0.1:8765/mcp
  sandboxctl mcp --listen 127.0.0.1:9000 --ttl 15m
  claude mcp add sandbox -- sandboxctl mcp --local    # register it with Claude Code

Tools (upstream's names and arguments): create_sandbox, delete_sandbox, execute_command,
upload_file, download_file, list_files, file_exists; resource sandboxes://{namespace}.
Every claim it creates expires --ttl after its last use, and is deleted when the server
exits (stdin closed, Ctrl-C, SIGTERM) unless --keep-sandboxes. Logs go to stderr
(SANDBOXCTL_LOG=info shows each tool call). Setup for MCP clients: docs/mcp.md.")]
    Mcp(McpArgs),
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  sandboxctl completion bash > /etc/bash_completion.d/sandboxctl
  sandboxctl completion zsh > \"${fpath[1]}/_sandboxctl\"")]
    Completion(CompletionArgs),
    /// Serve the sandbox runtime (how the local cluster's pods run; not for direct use).
    #[command(name = agent_sandbox_local::RUNTIME_SUBCOMMAND, hide = true)]
    Runtime(RuntimeArgs),
}

/// `sandboxctl dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Also write the kubeconfig here (default: only in the data directory).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Keep pods' files, logs and the signing key here (default: a temporary directory).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Sandboxes kept warm in the default pool (`python-sandbox-pool`).
    #[arg(long, default_value_t = 2)]
    pub replicas: i32,
    /// Port of the API server on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub api_port: u16,
    /// Port of the router on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub router_port: u16,
    /// Pod isolation: confined (each pod in namespaces of its own with only this machine's
    /// system directories, read-only; refuses to start where it cannot confine), strict (refuse
    /// to start unless every protection works: docs/cli.md "Local mode isolation"), none (pods
    /// run as plain processes with your rights: NOT isolated).
    #[arg(long, default_value = "confined")]
    pub isolation: Isolation,
    /// Pod networks of the local cluster: auto (own where this machine allows it: ip and nft,
    /// and root or user namespaces; else isolated), own (on a bridge, NetworkPolicies enforced;
    /// or refuse to start), isolated (loopback only).
    #[arg(long, default_value = "auto", value_parser = PodNetworks::for_users)]
    pub network: PodNetworks,
    /// Router authentication: token (one random bearer token), scoped (a token per sandbox,
    /// minted with a random signing key) or none.
    #[arg(long, default_value = "token", value_parser = ["token", "scoped", "none"])]
    pub auth: String,
}

/// How a command runs (shared by `run` and `exec`).
#[derive(Clone, Debug, Args)]
pub struct CommandArgs {
    /// Run the words as a program and its arguments without a shell. By default `sh -c` runs
    /// them: one word is a shell line as written ('echo $HOME | wc -c'); several words are a
    /// program and its arguments, quoted.
    #[arg(long)]
    pub no_shell: bool,
    /// Kill the command after this long (`30s`, `5m`).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Working directory in the sandbox.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Send this process's standard input to the command.
    #[arg(long)]
    pub stdin: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `sandboxctl run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Start a local cluster in this process for the run (no kubeconfig needed).
    #[arg(long)]
    pub local: bool,
    /// Warm pool to claim from.
    #[arg(long, default_value = agent_sandbox_local::DEFAULT_POOL)]
    pub pool: String,
    /// Delete the claim after this long even if this process is killed (0: never; at most
    /// 87600h).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = DEFAULT_CLAIM_TTL)]
    pub ttl: Duration,
    /// Give up waiting for a ready sandbox after this long.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = "2m")]
    pub wait_timeout: Duration,
    /// Pod isolation of the local cluster (`--local`): confined (each pod in namespaces of its own with only this machine's
    /// system directories, read-only; refuses to start where it cannot confine), strict (refuse
    /// to start unless every protection works: docs/cli.md "Local mode isolation"), none (pods
    /// run as plain processes with your rights: NOT isolated).
    #[arg(long, default_value = "confined")]
    pub isolation: Isolation,
    /// Pod networks of the local cluster: auto (own where this machine allows it: ip and nft,
    /// and root or user namespaces; else isolated), own (on a bridge, NetworkPolicies enforced;
    /// or refuse to start), isolated (loopback only).
    #[arg(long, default_value = "auto", value_parser = PodNetworks::for_users)]
    pub network: PodNetworks,
    /// How to run the command.
    #[command(flatten)]
    pub command: CommandArgs,
}

/// `sandboxctl claim`.
#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// Warm pool to claim from.
    #[arg(long)]
    pub pool: String,
    /// Delete the claim (and its sandbox) after this long, even if nobody deletes it (0: never;
    /// at most 87600h). `sandboxctl extend` moves it.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = DEFAULT_CLAIM_TTL)]
    pub ttl: Duration,
    /// Give up waiting for a ready sandbox after this long.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = "2m")]
    pub wait_timeout: Duration,
    /// Print the claim's details in this format instead of its name.
    #[arg(short = 'o', long, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// `sandboxctl exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The claim.
    pub claim: String,
    /// How to run the command.
    #[command(flatten)]
    pub command: CommandArgs,
}

/// `sandboxctl cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, `-` (stdin), or `CLAIM:path`.
    pub src: String,
    /// Destination: a local path, `-` (stdout), or `CLAIM:path`.
    pub dst: String,
}

/// `sandboxctl ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// `CLAIM` or `CLAIM:path`.
    pub target: String,
    /// Output format.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "table")]
    pub output: Format,
}

/// `CLAIM:path`.
#[derive(Debug, Args)]
pub struct PathArg {
    /// `CLAIM:path`.
    pub target: String,
}

/// `sandboxctl rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// `CLAIM:path`.
    pub target: String,
    /// Remove a directory and everything in it.
    #[arg(short = 'r', long)]
    pub recursive: bool,
}

/// `sandboxctl list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Claims of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "table")]
    pub output: Format,
}

/// `sandboxctl delete`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["claims", "all"]))]
pub struct DeleteArgs {
    /// Claims to delete.
    pub claims: Vec<String>,
    /// Every claim in the namespace.
    #[arg(long)]
    pub all: bool,
}

/// `sandboxctl extend`.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    /// The claim.
    pub claim: String,
    /// New lifetime from now (`30m`, `2h`).
    #[arg(value_parser = parse_duration)]
    pub duration: Duration,
}

/// A claim, for `suspend` and `resume`.
#[derive(Debug, Args)]
pub struct ClaimArg {
    /// The claim.
    pub claim: String,
}

/// `sandboxctl pools`.
#[derive(Debug, Args)]
pub struct PoolsArgs {
    /// Pools of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "table")]
    pub output: Format,
}

/// `sandboxctl logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The claim.
    pub claim: String,
    /// Keep printing new lines until the pod ends or Ctrl-C.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<i64>,
}

/// `sandboxctl token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The claim whose sandbox the token opens.
    pub claim: String,
    /// How long the token is valid.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = "1h")]
    pub ttl: Duration,
}

/// `sandboxctl mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Start a local cluster in this process for the server's lifetime (no kubeconfig
    /// needed); it stops when the server does.
    #[arg(long)]
    pub local: bool,
    /// Serve streamable HTTP on this address instead of stdio (at /mcp). Loopback only
    /// unless --allow-remote; port 0 picks a free one.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        default_missing_value = agent_sandbox_mcp::DEFAULT_LISTEN
    )]
    pub listen: Option<std::net::SocketAddr>,
    /// Allow --listen on an address that is not loopback. The server runs commands for
    /// anyone who reaches it and has no authentication: only behind an authenticating proxy.
    #[arg(long, requires = "listen")]
    pub allow_remote: bool,
    /// How long a sandbox lives after its last use unless create_sandbox says
    /// (shutdown_after_seconds); every tool call on it pushes its expiry this far.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = "5m")]
    pub ttl: Duration,
    /// Label value that marks this server's claims (mcp.k8s-agent-sandbox/session-id); the
    /// server uses no other claim. Default: a new random one. Reuse an earlier server's to
    /// take over its sandboxes.
    #[arg(long, value_name = "ID")]
    pub session_id: Option<String>,
    /// Do not delete this server's sandboxes when it exits (they still expire after --ttl).
    #[arg(long)]
    pub keep_sandboxes: bool,
    /// Bytes of each of stdout and stderr execute_command returns (longer output keeps its
    /// beginning and end, and says what was left out).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    pub max_output_bytes: usize,
    /// Largest file download_file returns.
    #[arg(long, value_name = "BYTES", default_value_t = 256 * 1024)]
    pub max_file_bytes: u64,
    /// Sandboxes kept warm in the local cluster's pool (`--local`).
    #[arg(long, default_value_t = 2)]
    pub replicas: i32,
    /// Pod isolation of the local cluster (`--local`): confined, strict, none (NOT isolated).
    #[arg(long, default_value = "confined")]
    pub isolation: Isolation,
    /// Pod networks of the local cluster (`--local`): auto, own, isolated.
    #[arg(long, default_value = "auto", value_parser = PodNetworks::for_users)]
    pub network: PodNetworks,
}

/// `sandboxctl completion`.
#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// The hidden runtime subcommand: the runtime's own flags.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// The runtime's flags (with its `SANDBOX_*` environment fallbacks).
    #[command(flatten)]
    pub args: agent_sandbox_local::runtime::Args,
}

//! The control-plane tier's Kubernetes: etcd, `kube-apiserver`, `kube-controller-manager` and
//! `kube-scheduler` from the binaries `cargo xtask tools` builds, as processes of this one, on
//! loopback only.
//!
//! [`ControlPlane::start`] writes a certificate authority and every certificate a small real
//! cluster has (the API server's serving certificate; client certificates for the admin, the
//! controller manager, the scheduler, the API server's calls to kubelets and one node; the
//! node's serving certificate) and a service-account signing key into one scratch directory,
//! starts the processes with the authorisation and admission a real cluster has (`Node,RBAC`,
//! `NodeRestriction`), and waits until the API server is ready. Dropping it kills every process
//! (they are also killed by the kernel if this process dies: parent-death signal) and removes
//! the directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;

use agent_sandbox_local::wait::{Check, wait_for};

use crate::error::{Error, Result};

/// The service CIDR (the `kubernetes` Service gets its first address).
pub(crate) const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The issuer of service-account tokens.
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// How long the API server may take to become ready (it is usually ready in 3 to 10 s).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The binaries of the control plane (`cargo xtask tools --print-bin-dir`).
#[derive(Clone, Debug)]
pub struct Tools {
    bin_dir: PathBuf,
}

impl Tools {
    /// The binaries in `bin_dir`; fails naming the first one missing and how to build them.
    pub fn in_dir(bin_dir: impl Into<PathBuf>) -> Result<Self> {
        let bin_dir = bin_dir.into();
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
        ] {
            if !bin_dir.join(name).is_file() {
                return Err(Error::Config(format!(
                    "{name} is missing from {}: run `cargo xtask tools` (it builds the control \
                     plane from its Go modules)",
                    bin_dir.display()
                )));
            }
        }
        Ok(Self { bin_dir })
    }

    /// The path of one binary.
    pub fn path(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// A client identity: its certificate and key, PEM.
#[derive(Clone)]
pub struct Identity {
    /// The certificate, PEM.
    pub cert: String,
    /// The private key, PEM (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

/// What a kubelet needs to join: its node name, client identity and serving certificate, and
/// the CA that signs the API server's client certificate for kubelet calls.
#[derive(Clone, Debug)]
pub struct NodeCredentials {
    /// The Node's name.
    pub node: String,
    /// A kubeconfig with the node's client certificate (`system:node:<node>`).
    pub kubeconfig: PathBuf,
    /// Serving certificate and key for the kubelet API (for 127.0.0.1 and the node name).
    pub serving_cert: PathBuf,
    /// The serving key.
    pub serving_key: PathBuf,
    /// CA of the client certificates the kubelet API accepts (the API server's).
    pub client_ca: PathBuf,
}

/// One process of the control plane.
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// The running control plane.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    processes: Vec<Process>,
    server: String,
    ca_pem: String,
    admin_kubeconfig: PathBuf,
    node: NodeCredentials,
    tools: Tools,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("dir", &self.dir.path())
            .field(
                "processes",
                &self.processes.iter().map(|p| p.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A port on 127.0.0.1 that nothing listened on a moment ago.
pub(crate) fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(Error::io("bind a free port on", "127.0.0.1"))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("read the address of", "127.0.0.1"))?
        .port();
    Ok(port)
}

fn tls(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |e| Error::Config(format!("cannot make the {what}: {e}"))
}

/// The cluster's certificate authority.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Authority {
    fn new() -> Result<Self> {
        let key = KeyPair::generate().map_err(tls("CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name("agent-sandbox-e2e-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(tls("CA certificate"))?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A certificate for `common_name` (in `organization`), for clients, servers or both.
    fn issue(
        &self,
        common_name: &str,
        organization: Option<&str>,
        server_names: &[&str],
        client: bool,
    ) -> Result<Identity> {
        let key = KeyPair::generate().map_err(tls("key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, organization);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if !server_names.is_empty() {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        for name in server_names {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => {
                    SanType::DnsName((*name).try_into().map_err(tls("certificate's DNS name"))?)
                }
            });
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(tls("certificate"))?;
        Ok(Identity {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

/// A kubeconfig (JSON, which every client reads as YAML) for `server` with a client
/// certificate or a bearer token.
pub fn kubeconfig_json(server: &str, ca_pem: &str, user: &KubeconfigUser<'_>) -> Vec<u8> {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let user = match user {
        KubeconfigUser::Certificate(identity) => json!({
            "client-certificate-data": b64(&identity.cert),
            "client-key-data": b64(&identity.key),
        }),
        KubeconfigUser::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "control-plane", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "control-plane", "context": {
            "cluster": "control-plane", "user": "user", "namespace": "default",
        }}],
        "current-context": "control-plane",
    });
    serde_json::to_vec_pretty(&config).unwrap_or_default()
}

/// Who a kubeconfig authenticates as.
#[derive(Debug)]
pub enum KubeconfigUser<'a> {
    /// A client certificate.
    Certificate(&'a Identity),
    /// A bearer token (a service account's).
    Token(&'a str),
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller manager and the scheduler, with credentials
    /// for one node named `node`; returns once the API server is ready.
    pub async fn start(tools: Tools, node: &str) -> Result<Self> {
        Self::start_for_node_at(tools, node, &[]).await
    }

    /// [`ControlPlane::start`] for a node whose kubelet the API server reaches at
    /// `node_addresses` (besides 127.0.0.1): its serving certificate names them too.
    pub async fn start_for_node_at(
        tools: Tools,
        node: &str,
        node_addresses: &[&str],
    ) -> Result<Self> {
        let started = Instant::now();
        let dir = crate::cluster::scratch_dir()?;
        let root = dir.path().to_path_buf();
        let write =
            |name: &str, text: &str| crate::cluster::write_private(&root, name, text.as_bytes());

        let ca = Authority::new()?;
        write("ca.crt", &ca.pem)?;
        // Pods on a real node reach the API server at its address on the node (through
        // kube-proxy's rules for the `kubernetes` Service), so it is named too.
        let mut names = vec![
            "127.0.0.1",
            "10.96.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        names.extend(node_addresses.iter().copied());
        let serving = ca.issue("kube-apiserver", None, &names, false)?;
        write("apiserver.crt", &serving.cert)?;
        write("apiserver.key", &serving.key)?;
        let kubelet_client = ca.issue(
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            &[],
            true,
        )?;
        write("apiserver-kubelet-client.crt", &kubelet_client.cert)?;
        write("apiserver-kubelet-client.key", &kubelet_client.key)?;
        let sa_key = KeyPair::generate().map_err(tls("service-account key"))?;
        write("sa.key", &sa_key.serialize_pem())?;
        // The API server reads verification keys as public keys (or PKCS#1/SEC 1 private keys,
        // not PKCS#8).
        write("sa.pub", &sa_key.public_key_pem())?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let api_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");

        let mut plane = Self {
            dir,
            processes: Vec::new(),
            server: server.clone(),
            ca_pem: ca.pem.clone(),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            node: NodeCredentials {
                node: node.to_owned(),
                kubeconfig: root.join("kubelet.kubeconfig"),
                serving_cert: root.join("kubelet.crt"),
                serving_key: root.join("kubelet.key"),
                client_ca: root.join("ca.crt"),
            },
            tools,
        };
        let path = |name: &str| root.join(name).display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        plane.spawn(
            "etcd",
            &[
                "--name=control-plane".to_owned(),
                format!("--data-dir={}", path("etcd")),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=control-plane={peer_url}"),
                // A test cluster: durability is not worth an fsync per write.
                "--unsafe-no-fsync=true".to_owned(),
                "--log-level=warn".to_owned(),
            ],
        )?;
        // On a real node the `kubernetes` Service's endpoint is the API server's address on the
        // node, which pods reach; a loopback advertise address cannot back it (then no
        // endpoint is kept, and our kubelet points pods at the API server itself).
        let (bind, advertise, reconciler) = match node_addresses.first() {
            Some(address) => ("0.0.0.0", *address, "lease"),
            None => ("127.0.0.1", "127.0.0.1", "none"),
        };
        plane.spawn(
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd_url}"),
                format!("--bind-address={bind}"),
                format!("--advertise-address={advertise}"),
                format!("--endpoint-reconciler-type={reconciler}"),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", path("apiserver-certs")),
                format!("--tls-cert-file={}", path("apiserver.crt")),
                format!("--tls-private-key-file={}", path("apiserver.key")),
                format!("--client-ca-file={}", path("ca.crt")),
                format!("--service-account-key-file={}", path("sa.pub")),
                format!("--service-account-signing-key-file={}", path("sa.key")),
                format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--authorization-mode=Node,RBAC".to_owned(),
                "--enable-admission-plugins=NodeRestriction".to_owned(),
                format!(
                    "--kubelet-client-certificate={}",
                    path("apiserver-kubelet-client.crt")
                ),
                format!(
                    "--kubelet-client-key={}",
                    path("apiserver-kubelet-client.key")
                ),
                format!("--kubelet-certificate-authority={}", path("ca.crt")),
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
                "--profiling=false".to_owned(),
                "--v=0".to_owned(),
            ],
        )?;

        let admin = ca.issue("e2e-admin", Some("system:masters"), &[], true)?;
        std::fs::write(
            &plane.admin_kubeconfig,
            kubeconfig_json(&server, &ca.pem, &KubeconfigUser::Certificate(&admin)),
        )
        .map_err(Error::io("write", &plane.admin_kubeconfig))?;
        let node_client = ca.issue(
            &format!("system:node:{node}"),
            Some("system:nodes"),
            &[],
            true,
        )?;
        std::fs::write(
            &plane.node.kubeconfig,
            kubeconfig_json(&server, &ca.pem, &KubeconfigUser::Certificate(&node_client)),
        )
        .map_err(Error::io("write", &plane.node.kubeconfig))?;
        let mut serving_names = vec!["127.0.0.1", node];
        serving_names.extend_from_slice(node_addresses);
        let node_serving = ca.issue(node, None, &serving_names, false)?;
        write("kubelet.crt", &node_serving.cert)?;
        write("kubelet.key", &node_serving.key)?;

        plane.wait_ready().await?;

        for (component, user) in [
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ] {
            let identity = ca.issue(user, None, &[], true)?;
            let kubeconfig = root.join(format!("{component}.kubeconfig"));
            std::fs::write(
                &kubeconfig,
                kubeconfig_json(&server, &ca.pem, &KubeconfigUser::Certificate(&identity)),
            )
            .map_err(Error::io("write", &kubeconfig))?;
        }
        plane.spawn(
            "kube-controller-manager",
            &[
                format!(
                    "--kubeconfig={}",
                    path("kube-controller-manager.kubeconfig")
                ),
                format!(
                    "--authentication-kubeconfig={}",
                    path("kube-controller-manager.kubeconfig")
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    path("kube-controller-manager.kubeconfig")
                ),
                "--bind-address=127.0.0.1".to_owned(),
                "--secure-port=0".to_owned(),
                "--leader-elect=false".to_owned(),
                format!("--service-account-private-key-file={}", path("sa.key")),
                // Every namespace gets `kube-root-ca.crt`, as projected token volumes expect.
                format!("--root-ca-file={}", path("ca.crt")),
                // Each controller acts with its own service account, as on a real cluster.
                "--use-service-account-credentials=true".to_owned(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--controllers=*".to_owned(),
                "--v=0".to_owned(),
            ],
        )?;
        plane.spawn(
            "kube-scheduler",
            &[
                format!("--kubeconfig={}", path("kube-scheduler.kubeconfig")),
                format!(
                    "--authentication-kubeconfig={}",
                    path("kube-scheduler.kubeconfig")
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    path("kube-scheduler.kubeconfig")
                ),
                "--bind-address=127.0.0.1".to_owned(),
                "--secure-port=0".to_owned(),
                "--leader-elect=false".to_owned(),
                "--v=0".to_owned(),
            ],
        )?;
        plane.check_alive()?;
        eprintln!(
            "e2e: control plane ready in {:.1} s at {server} ({})",
            started.elapsed().as_secs_f64(),
            plane.dir.path().display()
        );
        Ok(plane)
    }

    /// Starts `name` from the tools directory with its output in `<dir>/<name>.log`.
    fn spawn(&mut self, name: &'static str, args: &[String]) -> Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(Error::io("create", &log))?;
        let errors = file.try_clone().map_err(Error::io("open", &log))?;
        let program = self.tools.path(name);
        let mut command = Command::new(&program);
        command
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(errors);
        die_with_this_process(&mut command);
        let child = command.spawn().map_err(Error::io("start", &program))?;
        self.processes.push(Process { name, child, log });
        Ok(())
    }

    /// Fails naming the first process that exited, with the end of its log.
    fn check_alive(&mut self) -> Result<()> {
        for process in &mut self.processes {
            if let Ok(Some(status)) = process.child.try_wait() {
                return Err(Error::Config(format!(
                    "{} exited ({status}); the end of {}:\n{}",
                    process.name,
                    process.log.display(),
                    log_tail(&process.log, 25)
                )));
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client().await?;
        let what = format!("kube-apiserver at {} to be ready", self.server);
        wait_for(&what, READY_WITHIN, || {
            let client = client.clone();
            let alive = self.check_alive();
            async move {
                alive?;
                let seen = match http::Request::get("/readyz").body(Vec::new()) {
                    // kube logs each refused connection as an error; here they are expected
                    // until the server is up, and the last one is in the timeout's message.
                    Ok(request) => match tracing::instrument::WithSubscriber::with_subscriber(
                        client.request_text(request),
                        tracing::subscriber::NoSubscriber::default(),
                    )
                    .await
                    {
                        Ok(text) if text.trim() == "ok" => return Ok(Check::Done(())),
                        Ok(text) => text,
                        Err(error) => error.to_string(),
                    },
                    Err(error) => error.to_string(),
                };
                Ok::<_, Error>(Check::NotYet(seen))
            }
        })
        .await
    }

    /// A client with the admin's credentials (`system:masters`).
    pub async fn client(&self) -> Result<kube::Client> {
        crate::cluster::client_from(&self.admin_kubeconfig).await
    }

    /// A client with the node's credentials (`system:node:<node>`), as its kubelet has.
    pub async fn node_client(&self) -> Result<kube::Client> {
        crate::cluster::client_from(&self.node.kubeconfig).await
    }

    /// Runs `kubectl` (the one of [`Tools`]) as the admin in the workspace's root, so that
    /// paths such as `deploy/base` resolve; its output, or an error with kubectl's own words.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.run_tool("kubectl", args).await
    }

    /// `helm --kubeconfig <admin> <args>` (the `helm` next to the control plane's binaries, as
    /// `cargo xtask tools` builds it) in the workspace root; its standard output.
    pub async fn helm(&self, args: &[&str]) -> Result<String> {
        self.run_tool("helm", args).await
    }

    /// [`ControlPlane::kubectl`] with `input` on its standard input (`apply -f -`).
    pub async fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        use tokio::io::AsyncWriteExt as _;
        let program = self.tools.path("kubectl");
        let mut child = tokio::process::Command::new(&program)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io("run", &program))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .await
                .map_err(Error::io("write to", &program))?;
        }
        let output = child
            .wait_with_output()
            .await
            .map_err(Error::io("run", &program))?;
        if !output.status.success() {
            return Err(Error::Config(format!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    async fn run_tool(&self, name: &str, args: &[&str]) -> Result<String> {
        let program = self.tools.path(name);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."));
        let output = tokio::process::Command::new(&program)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .current_dir(root)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(Error::io("run", &program))?;
        if !output.status.success() {
            return Err(Error::Config(format!(
                "{name} {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The admin's kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// What the one node's kubelet needs.
    pub fn node(&self) -> &NodeCredentials {
        &self.node
    }

    /// The scratch directory (logs, certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The binaries.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// A kubeconfig that acts as service account `namespace/name` (a token from the
    /// TokenRequest API, valid for a day), written to `<dir>/<file>`.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        file: &str,
    ) -> Result<PathBuf> {
        let token = self.service_account_token(namespace, name).await?;
        crate::cluster::write_private(
            self.dir.path(),
            file,
            &kubeconfig_json(&self.server, &self.ca_pem, &KubeconfigUser::Token(&token)),
        )
    }

    /// The cluster's CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A token of service account `namespace/name` from the TokenRequest API, valid for a day.
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> Result<String> {
        let client = self.client().await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(86_400),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let answer = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(Error::kube(format!(
                "request a token for service account {namespace}/{name}"
            )))?;
        let token = answer
            .status
            .and_then(|status| status.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                Error::Config(format!(
                    "the API server issued no token for service account {namespace}/{name}"
                ))
            })?;
        Ok(token)
    }

    /// Kills every process (scheduler first, etcd last) and waits for them.
    pub fn stop(&mut self) {
        for process in self.processes.iter_mut().rev() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        self.processes.clear();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes the kernel kill the child when this process dies (a `SIGKILL`ed test run must leave no
/// etcd or API server behind). Children are started from a tokio worker or the main thread,
/// which live as long as the run: the signal follows the thread that forked.
pub(crate) fn die_with_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the child between fork and exec and only makes one
    // async-signal-safe system call (prctl), allocating nothing and taking no lock.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

/// The last `lines` lines of a log file.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

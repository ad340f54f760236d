//! The API server's TLS (sans IO): a certificate authority made when the sim starts, kept in
//! memory only, and the serving certificate it signs for every address a client of this
//! machine reaches the server at: 127.0.0.1 and `localhost`, and the `kubernetes` Service's
//! cluster IP and DNS names, through which pods with networks of their own reach it. Clients
//! trust the authority from the kubeconfig (`certificate-authority-data`) or, in pods, from the
//! `kube-root-ca.crt` ConfigMap.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::{Error, Result};

/// DNS names of the serving certificate besides `localhost`: the `kubernetes` Service's.
const SERVICE_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The authority and the server's TLS configuration.
pub(crate) struct ServerTls {
    /// The authority's certificate, PEM (what clients trust).
    pub(crate) ca_pem: String,
    /// The same, DER.
    pub(crate) ca_der: CertificateDer<'static>,
    /// The server's configuration: the serving certificate, HTTP/1.1 only.
    pub(crate) config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

fn failed(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Certificate { what, source }
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// A fresh authority and a serving certificate for 127.0.0.1, `localhost`, `service_ip` and
/// the `kubernetes` Service's names.
pub(crate) fn generate(service_ip: Ipv4Addr) -> Result<ServerTls> {
    let ca_key = KeyPair::generate().map_err(failed("the certificate authority's key"))?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = common_name("kube-sim-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca
        .self_signed(&ca_key)
        .map_err(failed("the certificate authority"))?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(failed("the serving key"))?;
    let mut serving = CertificateParams::default();
    serving.distinguished_name = common_name("kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.subject_alt_names = vec![
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V4(service_ip)),
        SanType::DnsName(
            "localhost"
                .try_into()
                .map_err(failed("the serving certificate's names"))?,
        ),
    ];
    for name in SERVICE_NAMES {
        serving.subject_alt_names.push(SanType::DnsName(
            name.try_into()
                .map_err(failed("the serving certificate's names"))?,
        ));
    }
    let cert = serving
        .signed_by(&key, &issuer)
        .map_err(failed("the serving certificate"))?;

    let ca_der = ca_cert.der().clone();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls { source })?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone(), ca_der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|source| Error::Tls { source })?;
    // The API is served over HTTP/1.1 (upgrades for port-forward need it); clients that offer
    // h2 fall back, as they do with any HTTP/1.1 server.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls {
        ca_pem: ca_cert.pem(),
        ca_der,
        config: Arc::new(config),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Completes a handshake over loopback, verifying the server as `name` against the
    /// authority alone.
    async fn handshake_as(tls: &ServerTls, name: &str) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            let mut stream = acceptor.accept(tcp).await?;
            stream.write_all(b"ok").await?;
            stream.shutdown().await
        });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(tls.ca_der.clone())
            .map_err(std::io::Error::other)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(std::io::Error::other)?;
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let result = async {
            let mut stream = connector.connect(server_name, tcp).await?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await?;
            assert_eq!(answer, b"ok");
            Ok(())
        }
        .await;
        server.abort();
        result
    }

    #[tokio::test]
    async fn the_serving_certificate_is_trusted_through_the_authority_for_every_name() {
        let tls = generate(Ipv4Addr::new(10, 96, 0, 1)).unwrap();
        assert!(tls.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        for name in [
            "127.0.0.1",
            "localhost",
            "10.96.0.1",
            "kubernetes.default.svc",
        ] {
            handshake_as(&tls, name)
                .await
                .unwrap_or_else(|error| panic!("{name}: {error}"));
        }
        // A name the certificate does not carry is refused.
        assert!(handshake_as(&tls, "example.com").await.is_err());
        // Another sim's authority does not vouch for this server.
        let other = generate(Ipv4Addr::new(10, 96, 0, 1)).unwrap();
        let mixed = ServerTls {
            ca_pem: other.ca_pem.clone(),
            ca_der: other.ca_der.clone(),
            config: tls.config.clone(),
        };
        assert!(handshake_as(&mixed, "127.0.0.1").await.is_err());
    }
}

//! A local cluster's API server answers only to the credential of the kubeconfig it writes,
//! which only its owner can read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt as _;

use agent_sandbox_local::{Isolation, LocalCluster, LocalConfig};
use agent_sandbox_sim::test_support::https_exchange;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn a_local_api_server_answers_401_without_the_kubeconfigs_credential() {
    let cluster = LocalCluster::start(LocalConfig {
        isolation: Isolation::None,
        ..LocalConfig::api_only()
    })
    .await
    .unwrap();
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    assert_eq!(mode(&kubeconfig), 0o600);
    assert_eq!(mode(kubeconfig.parent().unwrap()), 0o700);
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let sim = cluster.sim();

    let get = |authorization: String| {
        let request = format!(
            "GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: {}\r\n{authorization}\
             Connection: close\r\n\r\n",
            sim.addr()
        );
        async move {
            https_exchange(sim.ca_pem(), sim.addr(), request.as_bytes())
                .await
                .unwrap()
        }
    };
    let (code, body) = get(String::new()).await;
    assert_eq!(code, 401, "{body}");
    let (code, body) = get("Authorization: Bearer guessed\r\n".to_owned()).await;
    assert_eq!(code, 401, "{body}");
    // The kubeconfig's own credential is what opens it.
    let token = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("token: "))
        .expect("the kubeconfig carries a token");
    let (code, body) = get(format!("Authorization: Bearer {token}\r\n")).await;
    assert_eq!(code, 200, "{body}");

    // And a client built from the kubeconfig alone (TLS against its authority) works.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    assert!(config.cluster_url.to_string().starts_with("https://"));
    let pods: Api<Pod> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    pods.list(&ListParams::default()).await.unwrap();
    cluster.stop().await;
}

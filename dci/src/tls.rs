//! HTTPS: the `web.tls` certificate chain and private key (PEM) read into a rustls server config.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use disbatch_config::WebTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// Reads and checks both files; every error names the config key and the file.
pub fn server_config(tls: &WebTls) -> anyhow::Result<Arc<ServerConfig>> {
    let certs = certificates(&tls.cert_file)?;
    let key = private_key(&tls.key_file)?;
    // ring is the provider reqwest already builds; naming it avoids relying on a process default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("web.tls: setting up TLS")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            anyhow!(
                "web.tls: the certificate in {} and the key in {} cannot be used together: {e}",
                tls.cert_file.display(),
                tls.key_file.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The DNS names of the certificate (its subject alternative names): clients reach the DCI by
/// them, so they are allowed hosts. Read after `server_config` has accepted the files.
pub fn certificate_names(tls: &WebTls) -> anyhow::Result<Vec<String>> {
    let certs = certificates(&tls.cert_file)?;
    let Some(leaf) = certs.first() else {
        return Ok(Vec::new());
    };
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(|e| {
        anyhow!(
            "web.tls.cert_file {}: the first certificate cannot be parsed: {e}",
            tls.cert_file.display()
        )
    })?;
    Ok(cert.valid_dns_names().map(str::to_string).collect())
}

fn read(key: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow!("{key} {}: cannot read it: {e}", path.display()))
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    const KEY: &str = "web.tls.cert_file";
    let pem = read(KEY, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{KEY} {}: not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "{KEY} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    const KEY: &str = "web.tls.key_file";
    let pem = read(KEY, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow!(
            "{KEY} {}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}",
            path.display()
        )
    })
}

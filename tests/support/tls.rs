//! Certificates made for one test (rcgen): a private CA, a server certificate it signed for
//! `localhost`, `127.0.0.1` and `api.test` (a name only the test proxy resolves), and a
//! client certificate for mutual TLS; and a TLS acceptor (rustls) for the test server.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct Pki {
    dir: tempfile::TempDir,
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    server: (CertificateDer<'static>, Vec<u8>),
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// The server certificate and its key (PKCS#8) in PEM, for a server of another kind
    /// (a Kafka node).
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl Pki {
    /// A CA called `name`, with its server and client certificates.
    pub fn new(name: &str) -> Self {
        Self::with_client(name, "watchbridge test")
    }

    /// [`Pki::new`] with a client certificate whose common name is `client` (a Kafka node
    /// takes it for the principal's name).
    pub fn with_client(name: &str, client: &str) -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let leaf = |names: Vec<String>, common_name: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.use_authority_key_identifier_extension = true;
            params.key_usages.push(KeyUsagePurpose::DigitalSignature);
            params.extended_key_usages.push(usage);
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert, key)
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into(), "api.test".into()],
            "watchbridge test",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["client.test".into()],
            client,
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Self {
            dir: tempfile::tempdir().unwrap(),
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            server: (server_cert.der().clone(), server_key.serialize_der()),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        }
    }

    /// `text` in a file of this PKI's directory.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A TLS acceptor with the server certificate; with `client_auth`, it requires a client
    /// certificate signed by this CA.
    pub fn acceptor(&self, client_auth: bool) -> tokio_rustls::TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca_der.clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server.1.clone()));
        let config = builder
            .with_single_cert(vec![self.server.0.clone()], key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

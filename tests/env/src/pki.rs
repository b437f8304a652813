//! Keys and certificates for the local control plane: a CA, the apiserver's
//! serving certificate, and the service-account signing key. Generated per
//! environment so nothing secret is committed or shared between runs.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot generate {what}: {source}")]
    Generate { what: &'static str, source: rcgen::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Paths of the PEM files written into the environment's directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_pem: String,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
}

impl Pki {
    pub fn generate(dir: &Path) -> Result<Self, PkiError> {
        let gen_err = |what| move |source| PkiError::Generate { what, source };
        let ca_key = KeyPair::generate().map_err(gen_err("CA key"))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err("CA"))?;
        ca_params.distinguished_name.push(DnType::CommonName, "slotkeeper-local-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key).map_err(gen_err("CA certificate"))?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().map_err(gen_err("serving key"))?;
        let names = ["localhost", "127.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"];
        let mut serving_params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .map_err(gen_err("serving"))?;
        serving_params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        let serving_cert = serving_params.signed_by(&serving_key, &issuer).map_err(gen_err("serving certificate"))?;

        let sa_key = KeyPair::generate().map_err(gen_err("service-account key"))?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            ca_pem: ca_cert.pem(),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_key: dir.join("service-account.key"),
            service_account_public_key: dir.join("service-account.pub"),
        };
        write(&pki.ca_cert, &pki.ca_pem)?;
        write(&pki.serving_cert, &serving_cert.pem())?;
        write(&pki.serving_key, &serving_key.serialize_pem())?;
        write(&pki.service_account_key, &sa_key.serialize_pem())?;
        write(&pki.service_account_public_key, &sa_key.public_key_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, contents: &str) -> Result<(), PkiError> {
    std::fs::write(path, contents).map_err(|source| PkiError::Write { path: path.to_owned(), source })
}

//! The operator's own certificate authority for its conversion webhook: issue a CA
//! and serving certificates, (de)serialize them as a Secret's data, and decide when
//! to renew. Pure and synchronous; reading and writing the Secret is the caller's job.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// Keys of the Secret that holds the authority and the serving certificate.
pub const CA_CERT_KEY: &str = "ca.crt";
pub const CA_KEY_KEY: &str = "ca.key";
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";

const CA_COMMON_NAME: &str = "slotkeeper-webhook-ca";
const SERVING_COMMON_NAME: &str = "slotkeeper-webhook";
/// Certificates start this early so that a peer whose clock lags ours still accepts them.
const BACKDATE: Duration = Duration::from_secs(60 * 60);
const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(60 * 60);
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// The CA that signs the webhook's serving certificates; its certificate is the CRD's caBundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub ca_not_after: SystemTime,
}

/// The certificate the webhook's HTTPS server presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: SystemTime,
    pub not_before: SystemTime,
}

/// How long newly issued certificates are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub ca: Duration,
    pub serving: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes { ca: 365 * DAY, serving: 90 * DAY }
    }
}

/// What to do with the stored certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Keep,
    /// Issue a new serving certificate from the existing authority.
    NewServing,
    /// Replace the authority, and with it the serving certificate.
    NewAuthority,
}

/// Errors name the certificate or Secret key at fault; they never carry key material.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot generate the {what}: {source}")]
    Generate { what: &'static str, source: rcgen::Error },
    #[error("cannot read random bytes for a serial number: {0}")]
    Random(getrandom::Error),
    #[error("the Secret has no {key:?} entry")]
    MissingKey { key: &'static str },
    #[error("the Secret's {key:?} entry is not UTF-8 text")]
    NotUtf8 { key: &'static str },
    #[error("{key:?} is not a PEM certificate: {reason}")]
    BadCertificate { key: &'static str, reason: String },
    #[error("{key:?} is not a usable private key: {source}")]
    BadKey { key: &'static str, source: rcgen::Error },
    #[error("the private key {key:?} does not belong to the certificate {cert:?}")]
    KeyMismatch { key: &'static str, cert: &'static str },
    #[error("a serving certificate needs at least one subject alternative name")]
    NoSubjectAltNames,
    #[error("{name:?} is neither an IP address nor a valid DNS name: {source}")]
    BadSubjectAltName { name: String, source: rcgen::Error },
    #[error("a lifetime of {0:?} ends beyond what a certificate can express")]
    LifetimeOutOfRange(Duration),
}

/// A new self-signed ECDSA P-256 CA, valid from an hour before `now` for `lifetime`.
pub fn new_authority(now: SystemTime, lifetime: Duration) -> Result<Authority, CertError> {
    let key = generate_key("CA key")?;
    let validity = Validity::starting(now, lifetime)?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(random_serial()?);
    validity.apply_to(&mut params);
    let cert = params.self_signed(&key).map_err(generate_error("CA certificate"))?;
    Ok(Authority { ca_cert_pem: cert.pem(), ca_key_pem: key.serialize_pem(), ca_not_after: validity.not_after })
}

/// A serving certificate for `sans` (IP addresses or DNS names) with a fresh key, signed
/// by `authority`. It never outlives the authority, as it could not be verified after that.
pub fn issue_serving(
    authority: &Authority,
    sans: &[String],
    now: SystemTime,
    lifetime: Duration,
) -> Result<ServingCert, CertError> {
    if sans.is_empty() {
        return Err(CertError::NoSubjectAltNames);
    }
    let issuer = load_issuer(authority)?;
    let key = generate_key("serving key")?;
    let mut validity = Validity::starting(now, lifetime)?;
    validity.not_after = validity.not_after.min(authority.ca_not_after);
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans.iter().map(|name| san_type(name)).collect::<Result<_, _>>()?;
    params.distinguished_name.push(DnType::CommonName, SERVING_COMMON_NAME);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    // Explicit, because rcgen's default serial is derived from the key alone.
    params.serial_number = Some(random_serial()?);
    validity.apply_to(&mut params);
    let cert = params.signed_by(&key, &issuer).map_err(generate_error("serving certificate"))?;
    Ok(ServingCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: validity.not_after,
        not_before: validity.not_before,
    })
}

/// Reads the authority and serving certificate back from a Secret's data, checking that
/// every entry is present and parses, and that each key belongs to its certificate.
pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<(Authority, ServingCert), CertError> {
    let ca_cert_pem = secret_text(data, CA_CERT_KEY)?;
    let ca_key_pem = secret_text(data, CA_KEY_KEY)?;
    let cert_pem = secret_text(data, TLS_CERT_KEY)?;
    let key_pem = secret_text(data, TLS_KEY_KEY)?;
    let ca = CertFacts::parse(CA_CERT_KEY, &ca_cert_pem)?;
    let serving = CertFacts::parse(TLS_CERT_KEY, &cert_pem)?;
    ca.ensure_key_matches(CA_KEY_KEY, &ca_key_pem)?;
    serving.ensure_key_matches(TLS_KEY_KEY, &key_pem)?;
    let authority = Authority { ca_cert_pem, ca_key_pem, ca_not_after: ca.validity.not_after };
    let serving = ServingCert {
        cert_pem,
        key_pem,
        not_after: serving.validity.not_after,
        not_before: serving.validity.not_before,
    };
    Ok((authority, serving))
}

pub fn to_secret_data(authority: &Authority, serving: &ServingCert) -> BTreeMap<String, ByteString> {
    [
        (CA_CERT_KEY, &authority.ca_cert_pem),
        (CA_KEY_KEY, &authority.ca_key_pem),
        (TLS_CERT_KEY, &serving.cert_pem),
        (TLS_KEY_KEY, &serving.key_pem),
    ]
    .into_iter()
    .map(|(key, pem)| (key.to_owned(), ByteString(pem.as_bytes().to_vec())))
    .collect()
}

/// Renew a certificate once less than a third of its lifetime remains, so that a failed
/// attempt leaves plenty of time to retry. Anything unparseable or inconsistent is renewed.
pub fn renewal(authority: &Authority, serving: &ServingCert, sans: &[String], now: SystemTime) -> Renewal {
    if authority_needs_renewal(authority, now) {
        Renewal::NewAuthority
    } else if serving_due(authority, serving, sans, now) {
        Renewal::NewServing
    } else {
        Renewal::Keep
    }
}

/// How long until [`renewal`] may decide differently: the earlier of the two renewal
/// points, between one second and one hour away (the hour bounds the effect of clock jumps).
pub fn next_check(authority: &Authority, serving: &ServingCert, now: SystemTime) -> Duration {
    let ca = CertFacts::parse(CA_CERT_KEY, &authority.ca_cert_pem);
    let leaf = CertFacts::parse(TLS_CERT_KEY, &serving.cert_pem);
    let (Ok(ca), Ok(leaf)) = (ca, leaf) else {
        return MIN_CHECK_INTERVAL;
    };
    let earliest = ca.validity.renew_at().min(leaf.validity.renew_at());
    earliest.duration_since(now).unwrap_or_default().clamp(MIN_CHECK_INTERVAL, MAX_CHECK_INTERVAL)
}

fn authority_needs_renewal(authority: &Authority, now: SystemTime) -> bool {
    let Ok(ca) = CertFacts::parse(CA_CERT_KEY, &authority.ca_cert_pem) else {
        return true;
    };
    ca.validity.is_due(now) || ca.ensure_key_matches(CA_KEY_KEY, &authority.ca_key_pem).is_err()
}

/// Whether the serving certificate itself is due, whatever the CA's state.
pub fn serving_due(authority: &Authority, serving: &ServingCert, sans: &[String], now: SystemTime) -> bool {
    let Ok(leaf) = CertFacts::parse(TLS_CERT_KEY, &serving.cert_pem) else {
        return true;
    };
    leaf.validity.is_due(now)
        || leaf.sans != wanted_sans(sans)
        || leaf.ensure_key_matches(TLS_KEY_KEY, &serving.key_pem).is_err()
        || !chains_to(&serving.cert_pem, &authority.ca_cert_pem)
}

/// True when `cert_pem` names the CA as its issuer and carries a valid signature by its key.
fn chains_to(cert_pem: &str, ca_pem: &str) -> bool {
    let (Ok(cert_der), Ok(ca_der)) = (pem_to_der(TLS_CERT_KEY, cert_pem), pem_to_der(CA_CERT_KEY, ca_pem)) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) =
        (x509_parser::parse_x509_certificate(&cert_der), x509_parser::parse_x509_certificate(&ca_der))
    else {
        return false;
    };
    cert.issuer().as_raw() == ca.subject().as_raw() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// A certificate's validity window, truncated to whole seconds as X.509 stores it.
#[derive(Debug, Clone, Copy)]
struct Validity {
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Validity {
    fn starting(now: SystemTime, lifetime: Duration) -> Result<Self, CertError> {
        let now = whole_seconds(now);
        let not_after = now.checked_add(lifetime).ok_or(CertError::LifetimeOutOfRange(lifetime))?;
        Ok(Validity { not_before: now.checked_sub(BACKDATE).unwrap_or(now), not_after: whole_seconds(not_after) })
    }

    fn apply_to(&self, params: &mut CertificateParams) {
        params.not_before = OffsetDateTime::from(self.not_before);
        params.not_after = OffsetDateTime::from(self.not_after);
    }

    /// The point after which less than a third of the lifetime remains,
    /// counted from issue (the backdate is slack for skewed clocks, not
    /// lifetime: with it a short-lived certificate would always be due).
    fn renew_at(&self) -> SystemTime {
        let issued = self.not_before.checked_add(BACKDATE).filter(|t| *t < self.not_after).unwrap_or(self.not_before);
        let lifetime = self.not_after.duration_since(issued).unwrap_or_default();
        self.not_after.checked_sub(lifetime / 3).unwrap_or(self.not_before)
    }

    /// Also due when not valid yet: our clock has jumped back, so peers may reject it too.
    fn is_due(&self, now: SystemTime) -> bool {
        now < self.not_before || now >= self.renew_at()
    }
}

/// What the renewal decision needs from a certificate, owned so it outlives the DER.
#[derive(Debug)]
struct CertFacts {
    /// The Secret key the certificate was stored under, for error messages.
    entry: &'static str,
    validity: Validity,
    sans: BTreeSet<San>,
    public_key: Vec<u8>,
}

impl CertFacts {
    fn parse(key: &'static str, pem: &str) -> Result<Self, CertError> {
        let der = pem_to_der(key, pem)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| bad_certificate(key, e))?;
        Ok(CertFacts {
            entry: key,
            validity: Validity {
                not_before: cert.validity().not_before.to_datetime().into(),
                not_after: cert.validity().not_after.to_datetime().into(),
            },
            sans: cert_sans(&cert),
            public_key: cert.public_key().subject_public_key.data.to_vec(),
        })
    }

    fn ensure_key_matches(&self, key: &'static str, key_pem: &str) -> Result<(), CertError> {
        let pair = KeyPair::from_pem(key_pem).map_err(|source| CertError::BadKey { key, source })?;
        if pair.public_key_raw() == self.public_key.as_slice() {
            Ok(())
        } else {
            Err(CertError::KeyMismatch { key, cert: self.entry })
        }
    }
}

/// A subject alternative name in a form that compares equal however it was written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum San {
    Ip(IpAddr),
    Dns(String),
    /// Kinds we never issue; kept so that their presence counts as a difference.
    Other(String),
}

impl San {
    fn from_name(name: &str) -> Self {
        match name.parse::<IpAddr>() {
            Ok(ip) => San::Ip(ip),
            Err(_) => San::Dns(name.to_ascii_lowercase()),
        }
    }
}

fn wanted_sans(sans: &[String]) -> BTreeSet<San> {
    sans.iter().map(|name| San::from_name(name)).collect()
}

fn cert_sans(cert: &X509Certificate<'_>) -> BTreeSet<San> {
    let Ok(Some(extension)) = cert.subject_alternative_name() else {
        return BTreeSet::new();
    };
    extension.value.general_names.iter().map(general_name_to_san).collect()
}

fn general_name_to_san(name: &GeneralName<'_>) -> San {
    match name {
        GeneralName::DNSName(dns) => San::Dns(dns.to_ascii_lowercase()),
        GeneralName::IPAddress(octets) => match <[u8; 4]>::try_from(*octets) {
            Ok(v4) => San::Ip(IpAddr::from(v4)),
            Err(_) => <[u8; 16]>::try_from(*octets)
                .map(|v6| San::Ip(IpAddr::from(v6)))
                .unwrap_or_else(|_| San::Other(format!("{octets:?}"))),
        },
        other => San::Other(other.to_string()),
    }
}

fn san_type(name: &str) -> Result<SanType, CertError> {
    match name.parse::<IpAddr>() {
        Ok(ip) => Ok(SanType::IpAddress(ip)),
        Err(_) => name
            .to_owned()
            .try_into()
            .map(SanType::DnsName)
            .map_err(|source| CertError::BadSubjectAltName { name: name.to_owned(), source }),
    }
}

/// The CA as a signer, checked against its key so that what it signs chains to the stored certificate.
fn load_issuer(authority: &Authority) -> Result<Issuer<'static, KeyPair>, CertError> {
    CertFacts::parse(CA_CERT_KEY, &authority.ca_cert_pem)?.ensure_key_matches(CA_KEY_KEY, &authority.ca_key_pem)?;
    let key =
        KeyPair::from_pem(&authority.ca_key_pem).map_err(|source| CertError::BadKey { key: CA_KEY_KEY, source })?;
    Issuer::from_ca_cert_pem(&authority.ca_cert_pem, key)
        .map_err(|e| CertError::BadCertificate { key: CA_CERT_KEY, reason: e.to_string() })
}

fn pem_to_der(key: &'static str, pem: &str) -> Result<Vec<u8>, CertError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| bad_certificate(key, e))?;
    if block.label != "CERTIFICATE" {
        let reason = format!("found a {:?} PEM block", block.label);
        return Err(CertError::BadCertificate { key, reason });
    }
    Ok(block.contents)
}

fn secret_text(data: &BTreeMap<String, ByteString>, key: &'static str) -> Result<String, CertError> {
    let bytes = data.get(key).ok_or(CertError::MissingKey { key })?;
    String::from_utf8(bytes.0.clone()).map_err(|_| CertError::NotUtf8 { key })
}

fn generate_key(what: &'static str) -> Result<KeyPair, CertError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(generate_error(what))
}

/// 16 random bytes, most significant bit clear so the DER integer stays positive.
fn random_serial() -> Result<SerialNumber, CertError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(CertError::Random)?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

fn whole_seconds(time: SystemTime) -> SystemTime {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since_epoch) => UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs()),
        Err(_) => time,
    }
}

fn generate_error(what: &'static str) -> impl Fn(rcgen::Error) -> CertError {
    move |source| CertError::Generate { what, source }
}

fn bad_certificate(key: &'static str, error: impl std::fmt::Display) -> CertError {
    CertError::BadCertificate { key, reason: error.to_string() }
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;

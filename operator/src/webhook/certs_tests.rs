use super::*;

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn sans() -> Vec<String> {
    vec!["slotkeeper-webhook.slotkeeper.svc".to_owned(), "127.0.0.1".to_owned()]
}

fn fresh_pair(now: SystemTime) -> (Authority, ServingCert) {
    let lifetimes = Lifetimes::default();
    let authority = new_authority(now, lifetimes.ca).unwrap();
    let serving = issue_serving(&authority, &sans(), now, lifetimes.serving).unwrap();
    (authority, serving)
}

/// `fraction` of the way through the lifetime that starts at `start` (ignoring the backdate).
fn after(start: SystemTime, lifetime: Duration, fraction: f64) -> SystemTime {
    start + lifetime.mul_f64(fraction)
}

fn serial(pem: &str) -> Vec<u8> {
    let der = pem_to_der("test", pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.raw_serial().to_vec()
}

#[test]
fn authority_is_a_backdated_ca() {
    let authority = new_authority(t0(), 365 * DAY).unwrap();
    let der = pem_to_der(CA_CERT_KEY, &authority.ca_cert_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(cert.is_ca());
    assert!(cert.subject().to_string().contains(CA_COMMON_NAME));
    let usage = cert.key_usage().unwrap().unwrap().value;
    assert!(usage.key_cert_sign() && usage.crl_sign() && usage.digital_signature());
    assert_eq!(cert.validity().not_before.to_datetime(), OffsetDateTime::from(t0() - BACKDATE));
    assert_eq!(authority.ca_not_after, t0() + 365 * DAY);
}

#[test]
fn serving_cert_chains_to_its_authority_with_the_requested_names() {
    let (authority, serving) = fresh_pair(t0());
    assert!(chains_to(&serving.cert_pem, &authority.ca_cert_pem));
    let facts = CertFacts::parse(TLS_CERT_KEY, &serving.cert_pem).unwrap();
    assert_eq!(facts.sans, wanted_sans(&sans()));
    assert!(facts.sans.contains(&San::Ip("127.0.0.1".parse().unwrap())));
    facts.ensure_key_matches(TLS_KEY_KEY, &serving.key_pem).unwrap();
    assert_eq!(serving.not_before, t0() - BACKDATE);
    assert_eq!(serving.not_after, t0() + 90 * DAY);

    let der = pem_to_der(TLS_CERT_KEY, &serving.cert_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(!cert.is_ca());
    assert!(cert.extended_key_usage().unwrap().unwrap().value.server_auth);
    let has_aki = cert.iter_extensions().any(|ext| {
        matches!(ext.parsed_extension(), x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(_))
    });
    assert!(has_aki, "serving certificate lacks an authority key identifier");
}

#[test]
fn each_issue_has_a_fresh_key_and_serial() {
    let (authority, first) = fresh_pair(t0());
    let second = issue_serving(&authority, &sans(), t0(), 90 * DAY).unwrap();
    assert_ne!(first.key_pem, second.key_pem);
    assert_ne!(serial(&first.cert_pem), serial(&second.cert_pem));
}

#[test]
fn serving_cert_never_outlives_its_authority() {
    let authority = new_authority(t0(), 30 * DAY).unwrap();
    let serving = issue_serving(&authority, &sans(), t0(), 90 * DAY).unwrap();
    assert_eq!(serving.not_after, authority.ca_not_after);
}

#[test]
fn issuing_needs_valid_names() {
    let authority = new_authority(t0(), 365 * DAY).unwrap();
    assert!(matches!(issue_serving(&authority, &[], t0(), DAY), Err(CertError::NoSubjectAltNames)));
    let error = issue_serving(&authority, &["bad name\u{e9}".to_owned()], t0(), DAY).unwrap_err();
    assert!(matches!(error, CertError::BadSubjectAltName { .. }), "{error}");
}

#[test]
fn issuing_refuses_a_key_that_is_not_the_authoritys() {
    let (mut authority, _) = fresh_pair(t0());
    authority.ca_key_pem = new_authority(t0(), DAY).unwrap().ca_key_pem;
    let error = issue_serving(&authority, &sans(), t0(), DAY).unwrap_err();
    assert!(matches!(error, CertError::KeyMismatch { key: CA_KEY_KEY, cert: CA_CERT_KEY }), "{error}");
}

#[test]
fn secret_data_round_trips() {
    let (authority, serving) = fresh_pair(t0());
    let data = to_secret_data(&authority, &serving);
    assert_eq!(data.keys().collect::<Vec<_>>(), [CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY]);
    assert_eq!(from_secret_data(&data).unwrap(), (authority, serving));
}

#[test]
fn missing_secret_entry_is_named() {
    let (authority, serving) = fresh_pair(t0());
    let mut data = to_secret_data(&authority, &serving);
    data.remove(TLS_KEY_KEY);
    let error = from_secret_data(&data).unwrap_err();
    assert!(matches!(error, CertError::MissingKey { key: TLS_KEY_KEY }));
    assert!(error.to_string().contains("tls.key"), "{error}");
}

#[test]
fn corrupt_secret_entries_are_named_without_key_material() {
    let (authority, serving) = fresh_pair(t0());
    let mut data = to_secret_data(&authority, &serving);
    data.insert(CA_CERT_KEY.to_owned(), ByteString(b"not a certificate".to_vec()));
    assert!(from_secret_data(&data).unwrap_err().to_string().contains("ca.crt"));

    let mut data = to_secret_data(&authority, &serving);
    let truncated = &serving.key_pem[..serving.key_pem.len() / 2];
    data.insert(TLS_KEY_KEY.to_owned(), ByteString(truncated.as_bytes().to_vec()));
    let message = from_secret_data(&data).unwrap_err().to_string();
    assert!(message.contains("tls.key"), "{message}");
    let key_body = serving.key_pem.lines().nth(1).unwrap();
    assert!(!message.contains(key_body), "{message}");
}

#[test]
fn fresh_certificates_are_kept() {
    let (authority, serving) = fresh_pair(t0());
    assert_eq!(renewal(&authority, &serving, &sans(), t0()), Renewal::Keep);
    let reordered: Vec<String> = sans().into_iter().rev().map(|s| s.to_uppercase()).collect();
    assert_eq!(renewal(&authority, &serving, &reordered, t0()), Renewal::Keep);
}

#[test]
fn serving_cert_is_renewed_when_a_third_of_its_lifetime_remains() {
    let (authority, serving) = fresh_pair(t0());
    let at_60_percent = after(t0(), 90 * DAY, 0.6);
    let at_70_percent = after(t0(), 90 * DAY, 0.7);
    assert_eq!(renewal(&authority, &serving, &sans(), at_60_percent), Renewal::Keep);
    assert_eq!(renewal(&authority, &serving, &sans(), at_70_percent), Renewal::NewServing);
}

#[test]
fn serving_cert_is_renewed_when_its_names_change() {
    let (authority, serving) = fresh_pair(t0());
    let mut more = sans();
    more.push("10.0.0.1".to_owned());
    assert_eq!(renewal(&authority, &serving, &more, t0()), Renewal::NewServing);
    assert_eq!(renewal(&authority, &serving, &sans()[..1], t0()), Renewal::NewServing);
}

#[test]
fn serving_cert_from_another_authority_is_renewed() {
    let (authority, _) = fresh_pair(t0());
    let (_, foreign) = fresh_pair(t0());
    assert_eq!(renewal(&authority, &foreign, &sans(), t0()), Renewal::NewServing);
}

#[test]
fn serving_cert_with_the_wrong_key_is_renewed() {
    let (authority, mut serving) = fresh_pair(t0());
    serving.key_pem = issue_serving(&authority, &sans(), t0(), DAY).unwrap().key_pem;
    assert_eq!(renewal(&authority, &serving, &sans(), t0()), Renewal::NewServing);
}

#[test]
fn authority_is_renewed_when_a_third_of_its_lifetime_remains() {
    let (authority, _) = fresh_pair(t0());
    let now = after(t0(), 365 * DAY, 0.7);
    let serving = issue_serving(&authority, &sans(), now, 90 * DAY).unwrap();
    assert_eq!(renewal(&authority, &serving, &sans(), now), Renewal::NewAuthority);
}

#[test]
fn unparseable_authority_is_renewed() {
    let (mut authority, serving) = fresh_pair(t0());
    authority.ca_cert_pem = "garbage".to_owned();
    assert_eq!(renewal(&authority, &serving, &sans(), t0()), Renewal::NewAuthority);
}

#[test]
fn certificates_from_the_future_are_renewed() {
    let (authority, serving) = fresh_pair(t0());
    let before_issue = t0() - 2 * BACKDATE;
    assert_eq!(renewal(&authority, &serving, &sans(), before_issue), Renewal::NewAuthority);
}

#[test]
fn next_check_is_bounded() {
    let (authority, serving) = fresh_pair(t0());
    assert_eq!(next_check(&authority, &serving, t0()), MAX_CHECK_INTERVAL);
    // A third of the lifetime from issue (the backdate is not lifetime).
    let issued = serving.not_before + BACKDATE;
    let serving_renew_at = serving.not_after - (serving.not_after.duration_since(issued).unwrap() / 3);
    let ten_minutes_before = serving_renew_at - Duration::from_secs(600);
    assert_eq!(next_check(&authority, &serving, ten_minutes_before), Duration::from_secs(600));
    assert_eq!(next_check(&authority, &serving, serving_renew_at + DAY), MIN_CHECK_INTERVAL);
    let broken = ServingCert { cert_pem: String::new(), ..serving };
    assert_eq!(next_check(&authority, &broken, t0()), MIN_CHECK_INTERVAL);
}

#[test]
fn a_short_lived_certificate_is_due_a_third_before_it_ends_not_at_once() {
    let now = t0();
    let authority = new_authority(now, Duration::from_secs(60)).unwrap();
    let serving = issue_serving(&authority, &sans(), now, Duration::from_secs(30)).unwrap();
    assert_eq!(renewal(&authority, &serving, &sans(), now + Duration::from_secs(15)), Renewal::Keep);
    assert_eq!(renewal(&authority, &serving, &sans(), now + Duration::from_secs(21)), Renewal::NewServing);
    assert_eq!(renewal(&authority, &serving, &sans(), now + Duration::from_secs(41)), Renewal::NewAuthority);
}

#[test]
fn default_lifetimes() {
    assert_eq!(Lifetimes::default(), Lifetimes { ca: 365 * DAY, serving: 90 * DAY });
}

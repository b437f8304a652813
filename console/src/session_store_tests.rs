use k8s_openapi::ByteString;

use super::*;

fn entry(expires: i64, user: &str) -> Entry {
    Entry { key: SessionKey::generate(), expires, user: fingerprint(user) }
}

fn id(n: usize) -> String {
    URL_SAFE_NO_PAD.encode((n as u128).to_be_bytes())
}

#[test]
fn entries_read_back_exactly_and_nothing_else_reads() {
    let one = entry(1_700_000_000, "alice");
    assert_eq!(Entry::decode(&one.encode()), Some(one));
    assert_eq!(Entry::decode(&one.encode()[1..]), None, "short");
    assert_eq!(Entry::decode(&[one.encode(), vec![0]].concat()), None, "long");
    assert_eq!(Entry::decode(&[]), None);
}

#[test]
fn cookies_name_a_session_id_of_its_shape_only() {
    let good = id(7);
    assert_eq!(good.len(), ID_CHARS);
    assert_eq!(parse_cookie(&format!("{good}.sealed")), Some((good.as_str(), "sealed")));
    for bad in ["", ".", "sealed", "short.sealed", "../../../../../../../etc/passwd.x", "aaaaaaaaaaaaaaaaaaaaa=.x"] {
        assert_eq!(parse_cookie(bad), None, "{bad:?}");
    }
    proptest::proptest!(|(value in proptest::prelude::any::<String>())| {
        if let Some((id, _)) = parse_cookie(&value) {
            proptest::prop_assert!(id_like(id));
        }
    });
}

/// A hostile or damaged Secret: keys that are no session id and values of
/// the wrong size are skipped, the rest still open.
#[test]
fn a_secret_yields_only_its_well_formed_sessions() {
    let good = entry(10, "alice");
    let secret = Secret {
        data: Some(
            [
                (id(1), ByteString(good.encode())),
                (id(2), ByteString(vec![1, 2, 3])),
                ("not-an-id".to_owned(), ByteString(good.encode())),
            ]
            .into(),
        ),
        ..Default::default()
    };
    assert_eq!(entries_of(&secret), [(id(1), good)].into());
    assert!(entries_of(&Secret::default()).is_empty());
}

#[test]
fn room_is_made_from_expired_sessions_then_the_users_oldest_then_the_oldest_of_all() {
    let now = 1000;
    let mut entries: HashMap<String, Entry> =
        (0..MOST_PER_USER).map(|n| (id(n), entry(2000 + n as i64, "alice"))).collect();
    entries.insert(id(100), entry(999, "bob"));
    entries.insert(id(101), entry(5000, "bob"));
    let mut removed = make_room(&entries, fingerprint("alice"), now);
    removed.sort();
    let mut expected = vec![id(0), id(100)];
    expected.sort();
    assert_eq!(removed, expected, "bob's expired session and alice's oldest");
    assert_eq!(make_room(&entries, fingerprint("bob"), now), vec![id(100)], "bob has room");

    // Full: the oldest of all gives way, whoever it is; nobody is locked out.
    let full: HashMap<String, Entry> =
        (0..MOST).map(|n| (id(n), entry(2000 + n as i64, &format!("user-{n}")))).collect();
    assert_eq!(make_room(&full, fingerprint("carol"), now), vec![id(0)]);
    let mut with_expired = full;
    with_expired.insert(id(MOST), entry(now, "dave"));
    with_expired.remove(&id(0));
    assert_eq!(make_room(&with_expired, fingerprint("carol"), now), vec![id(MOST)], "the expired one suffices");
}

/// What is known answers within its freshness; a failed read keeps
/// everyone out for a moment instead of reading again at once.
#[test]
fn known_sessions_answer_while_fresh_and_a_failed_read_fails_closed() {
    let alice = entry(2000, "alice");
    let now = Instant::now();
    let fresh = Known { entries: [(id(1), alice)].into(), read: Some(now), failed: None };
    assert_eq!(fresh.answer(&id(1)), Some(Some(alice)));
    assert_eq!(fresh.answer(&id(2)), Some(None), "unknown, but read a moment ago");
    let stale =
        Known { read: now.checked_sub(FRESH), ..Known { entries: [(id(1), alice)].into(), ..Known::default() } };
    assert_eq!(stale.answer(&id(1)), None, "read again first");
    let failed = Known { entries: [(id(1), alice)].into(), read: None, failed: Some(now) };
    assert_eq!(failed.answer(&id(1)), Some(None), "closed right after a failed read");
    let failed_long_ago = Known { failed: now.checked_sub(FAILED_PAUSE), ..Known::default() };
    assert_eq!(failed_long_ago.answer(&id(1)), None, "tried again after the pause");
}

/// What the session store is for: the shared key opens no session cookie,
/// and once a session's own key is gone nothing opens it.
#[test]
fn a_session_opens_only_with_its_own_key() {
    let shared = SessionKey::new(&SessionKey::generate()).unwrap();
    let own = entry(2000, "alice");
    let session = Session::new("alice".into(), vec![], "secret-token".into(), 1000);
    let sealed = SessionKey::new(&own.key).unwrap().seal(&session);
    assert!(!sealed.contains("secret-token"));
    assert_eq!(SessionKey::new(&own.key).unwrap().open::<Session>(&sealed), Some(session));
    assert_eq!(shared.open::<Session>(&sealed), None);
    assert_eq!(SessionKey::new(&entry(2000, "alice").key).unwrap().open::<Session>(&sealed), None);
}

use super::*;
use crate::catalog::lookup;

fn app(name: &str, rules: &[&str]) -> AclUser {
    AclUser {
        name: name.into(),
        password_secret: SecretKeyRef { name: "app-redis".into(), key: "password".into() },
        rules: rules.iter().map(|r| (*r).to_owned()).collect(),
    }
}

fn spec(users: Vec<AclUser>) -> AclSpec {
    AclSpec { default_user: DefaultUser::Enabled, users }
}

fn redis(version: &str) -> &'static CatalogEntry {
    lookup(Engine::Redis, version).unwrap()
}

#[test]
fn an_applications_rules_are_tokens_of_the_grammar() {
    let ok = spec(vec![app("app", &["~app:*", "&news", "+@all", "-@dangerous", "+get", "-cluster|reset", "allkeys"])]);
    assert_eq!(validate(&ok, &[redis("7.0.15")]), Ok(()));
    for bad in [
        ">secret",
        "<secret",
        "#abc",
        "nopass",
        "on",
        "off",
        "reset",
        "resetpass",
        "(~x +get)",
        "+@nope",
        "+GET",
        "~a b",
        "~a\"b",
        "~a\nb",
        "+get\n+set",
        "",
    ] {
        let refused = validate(&spec(vec![app("app", &[bad])]), &[]);
        assert!(matches!(refused, Err(AclError::Rule { .. })), "{bad:?}: {refused:?}");
        assert!(refused.unwrap_err().to_string().starts_with("spec.acl.users[0].rules:"));
    }
}

#[test]
fn what_redis_6_2_cannot_read_is_refused_for_it_only() {
    for rule in ["%R~cache:*", "-cluster|reset"] {
        let acl = spec(vec![app("app", &[rule])]);
        assert_eq!(validate(&acl, &[redis("7.0.15")]), Ok(()), "{rule}");
        let refused = validate(&acl, &[redis("6.2.14"), redis("7.0.15")]).unwrap_err().to_string();
        assert!(refused.contains("6.2") || refused.contains("7.0 or later"), "{refused}");
    }
}

#[test]
fn names_are_plain_unique_and_not_the_operators() {
    for bad in ["default", "slotkeeper-operator", "slotkeeperx", "a b", "-lead", "", &"x".repeat(65)] {
        assert!(matches!(validate(&spec(vec![app(bad, &[])]), &[]), Err(AclError::Name { .. })), "{bad:?}");
    }
    let twice = validate(&spec(vec![app("app", &[]), app("app", &[])]), &[]);
    assert!(matches!(twice, Err(AclError::Duplicate { index: 1, .. })));
}

fn hashes() -> Hashes {
    Hashes {
        default: "d".repeat(64),
        operator: "o".repeat(64),
        replication: "r".repeat(64),
        applications: vec!["a".repeat(64)],
    }
}

#[test]
fn every_user_starts_from_reset_applications_cannot_take_the_cluster_and_default_goes_last() {
    let mut acl = spec(vec![app("app", &["~*", "+@all"])]);
    let users = users(&acl, &hashes());
    let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, [OPERATOR_USER, REPLICATION_USER, "app", "default"]);
    assert!(users.iter().all(|u| u.rules[0] == "reset"));
    let app_rules = &users[2].rules;
    assert_eq!(app_rules[..5], ["reset", "on", &format!("#{}", "a".repeat(64)), "~*", "+@all"]);
    assert!(app_rules.ends_with(&APPLICATION_DENIED.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>()));
    assert!(users.iter().all(|u| u.rules.iter().all(|r| !r.starts_with('>'))), "no password in the clear");
    acl.default_user = DefaultUser::Disabled;
    let off = super::users(&acl, &hashes()).pop().unwrap();
    assert_eq!(off.rules[..2], ["reset", "off"]);
    assert!(!off.rules.iter().any(|r| r.starts_with('#')));
}

//! Kubernetes' `$(VAR)` expansion for command, args and env values:
//! `$(NAME)` is replaced when NAME is defined, kept as is otherwise, and `$$`
//! escapes a literal `$`.

use std::collections::HashMap;

pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_defined_keeps_undefined_and_unescapes() {
        let vars = HashMap::from([("POD_IP".to_string(), "127.1.0.2".to_string())]);
        assert_eq!(expand("--bind $(POD_IP)", &vars), "--bind 127.1.0.2");
        assert_eq!(expand("$(MISSING)x", &vars), "$(MISSING)x");
        assert_eq!(expand("$$(POD_IP) $5 $(", &vars), "$(POD_IP) $5 $(");
    }
}

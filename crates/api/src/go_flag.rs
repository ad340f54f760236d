//! Go's `flag` package syntax, so that argument lists written for upstream's Go binaries (the
//! controller's and router's manifests, its Helm chart) start ours unchanged.
//!
//! Go accepts, for a flag named `name`: `-name`, `--name` (one or two dashes mean the same),
//! `-name=value`, `-name value` (not for booleans) and, for a boolean, the bare `-name` meaning
//! true. A boolean never takes the next argument as its value. Booleans are spelled as Go's
//! `strconv.ParseBool` spells them.
//!
//! clap handles two dashes, `=`, and (with `num_args = 0..=1`, `require_equals = true`,
//! `default_missing_value = "true"`) bare booleans; what is left is the single dash, which
//! [`normalize_args`] rewrites, and the boolean literals, which [`parse_bool`] reads. Durations
//! are [`crate::units::parse_duration`], which already takes Go's spelling.

/// Reads a boolean as Go's `strconv.ParseBool` does: `1 t T TRUE true True` and
/// `0 f F FALSE false False`. Anything else is an error naming the value.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean {text:?}: expected true or false (or 1, 0, t, f, TRUE, FALSE, True, False)"
        )),
    }
}

/// Rewrites Go's single-dash spelling of a long flag (`-leader-elect=true`, `-kubeconfig x`) to
/// two dashes, for the names in `long_names` only: any other argument (a short flag, a value, a
/// positional, anything after `--`) is returned unchanged, so clap still reports what it does
/// not know.
pub fn normalize_args<I, S>(args: I, long_names: &[&str]) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString>,
{
    let mut out = Vec::new();
    let mut after_terminator = false;
    for (index, arg) in args.into_iter().enumerate() {
        let arg: std::ffi::OsString = arg.into();
        // The first argument is the program's name.
        if index == 0 || after_terminator {
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            after_terminator = true;
            out.push(arg);
            continue;
        }
        match text.strip_prefix('-') {
            Some(rest) if !rest.starts_with('-') => {
                let name = rest.split_once('=').map_or(rest, |(name, _)| name);
                if name.len() > 1 && long_names.contains(&name) {
                    out.push(format!("-{text}").into());
                } else {
                    out.push(arg);
                }
            }
            _ => out.push(arg),
        }
    }
    out
}

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// A listen address as Go's `net.Listen` takes it in upstream's flags: `:8080` (every IPv4
/// address; Go's also listens on IPv6 where there is one), `host:port` with an IP, `[v6]:port` or
/// `localhost:port`; `""` or `0` mean no listener.
pub fn parse_bind_address(text: &str) -> Result<Option<SocketAddr>, String> {
    let text = text.trim();
    if text.is_empty() || text == "0" {
        return Ok(None);
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| "expected host:port or :port".to_owned())?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        _ => host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .parse()
            .map_err(|_| format!("host {host:?} is not an IP address (or empty, or localhost)"))?,
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_in_go_spelling() {
        let parsed = |text| parse_bind_address(text).unwrap();
        assert_eq!(
            parsed(":8080"),
            Some(SocketAddr::from(([0, 0, 0, 0], 8080)))
        );
        assert_eq!(
            parsed("localhost:1"),
            Some(SocketAddr::from(([127, 0, 0, 1], 1)))
        );
        assert_eq!(parsed("[::1]:9"), Some("[::1]:9".parse().unwrap()));
        assert_eq!(parsed("10.1.2.3:80"), Some("10.1.2.3:80".parse().unwrap()));
        assert_eq!(parsed(""), None);
        assert_eq!(parsed("0"), None);
        for bad in ["8080", "example.com:80", ":http", ":-1"] {
            assert!(parse_bind_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans_are_read_as_go_reads_them() {
        for text in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(text), Ok(true), "{text}");
        }
        for text in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(text), Ok(false), "{text}");
        }
        for text in ["yes", "on", "", "tRUE", "2"] {
            let error = parse_bool(text).unwrap_err();
            assert!(error.contains(&format!("{text:?}")), "{error}");
        }
    }

    #[test]
    fn single_dash_long_flags_get_two_dashes_and_nothing_else_changes() {
        let args = normalize_args(
            [
                "controller",
                "-leader-elect=true",
                "-kubeconfig",
                "/k",
                "--extensions",
                "-v",
                "-unknown=1",
                "value",
                "--",
                "-kubeconfig",
            ],
            &["leader-elect", "kubeconfig", "extensions", "v"],
        );
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "controller",
                "--leader-elect=true",
                "--kubeconfig",
                "/k",
                "--extensions",
                "-v",
                "-unknown=1",
                "value",
                "--",
                "-kubeconfig",
            ]
        );
    }
}

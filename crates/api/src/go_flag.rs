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

#[cfg(test)]
mod tests {
    use super::*;

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

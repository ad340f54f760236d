//! How every binary of the project ends on an error: one line on stderr, `error: ...`, and exit
//! status [`CONFIGURATION`] when what the user gave cannot be used (a flag, an environment
//! variable, a path, a port), 1 for anything else. Scripts and kubelets tell the two apart by
//! the status, so it is a contract like any wire constant. Pure text functions; the binaries
//! print.

/// Exit status of a configuration error: the same as clap's for a bad command line.
pub const CONFIGURATION: u8 = 2;

/// The exit status for an error: [`CONFIGURATION`] when it is one, else 1.
pub fn status(configuration: bool) -> u8 {
    if configuration { CONFIGURATION } else { 1 }
}

/// An error and its causes on one line, `a: b: c`: a cause whose text is already there is left
/// out (kube's and anyhow's errors often repeat their source), and runs of white space,
/// newlines included, become one space.
pub fn error_line(error: &dyn std::error::Error) -> String {
    let mut text = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    fold_whitespace(&text)
}

/// clap's rendered text for a bad command line as one line: its first paragraph (the error,
/// without the usage and tip paragraphs), white space folded, and where to read more.
pub fn usage_line(rendered: &str, program: &str) -> String {
    let message = rendered.split("\n\n").next().unwrap_or_default();
    format!("{} (see {program} --help)", fold_whitespace(message))
}

fn fold_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn causes_join_without_repeats_on_one_line() {
        let error = Layer(
            "failed to bind 127.0.0.1:1",
            Some(Box::new(Layer(
                "permission\n denied",
                Some(Box::new(Layer("denied", None))),
            ))),
        );
        assert_eq!(
            error_line(&error),
            "failed to bind 127.0.0.1:1: permission denied"
        );
    }

    #[test]
    fn usage_keeps_the_first_paragraph() {
        let rendered = "error: unexpected argument '--nope' found\n\n  tip: try '--nap'\n\nUsage: kube-sim [OPTIONS]\n";
        assert_eq!(
            usage_line(rendered, "kube-sim"),
            "error: unexpected argument '--nope' found (see kube-sim --help)"
        );
    }
}

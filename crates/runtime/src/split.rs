//! Splitting a legacy `/execute` command line into argv, the way upstream's python runtime does
//! (`shlex.split`, POSIX mode, no comments). Pure; no shell is involved.

/// Why a command line could not be split (Python's messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SplitError {
    /// A `'` or `"` was not closed.
    #[error("No closing quotation")]
    NoClosingQuotation,
    /// A `\` ended the line.
    #[error("No escaped character")]
    NoEscapedCharacter,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between words.
    Between,
    /// Inside an unquoted word.
    Word,
    /// Inside `'...'`.
    Single,
    /// Inside `"..."`.
    Double,
}

/// Splits `line` into words with Python's `shlex.split` rules: whitespace separates words,
/// `'...'` is literal, `"..."` is literal except that `\` escapes `"` and `\`, a `\` outside
/// quotes takes the next character literally, and adjacent quoted and unquoted parts join.
pub(crate) fn split(line: &str) -> Result<Vec<String>, SplitError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut state = State::Between;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match state {
            State::Between | State::Word => match c {
                ' ' | '\t' | '\n' | '\r' => {
                    if state == State::Word {
                        words.push(std::mem::take(&mut word));
                        state = State::Between;
                    }
                }
                '\'' => state = State::Single,
                '"' => state = State::Double,
                '\\' => {
                    word.push(chars.next().ok_or(SplitError::NoEscapedCharacter)?);
                    state = State::Word;
                }
                other => {
                    word.push(other);
                    state = State::Word;
                }
            },
            State::Single => match c {
                '\'' => state = State::Word,
                other => word.push(other),
            },
            State::Double => match c {
                '"' => state = State::Word,
                '\\' => match chars.next() {
                    Some(next @ ('"' | '\\')) => word.push(next),
                    Some(next) => {
                        word.push('\\');
                        word.push(next);
                    }
                    None => return Err(SplitError::NoEscapedCharacter),
                },
                other => word.push(other),
            },
        }
    }
    match state {
        State::Single | State::Double => Err(SplitError::NoClosingQuotation),
        State::Word => {
            words.push(word);
            Ok(words)
        }
        State::Between => Ok(words),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn ok(line: &str) -> Vec<String> {
        split(line).unwrap()
    }

    /// Expected values are what CPython's `shlex.split` returns for the same input.
    #[test]
    fn matches_python_shlex_split() {
        assert_eq!(ok("echo hello"), ["echo", "hello"]);
        assert_eq!(ok("  echo   a\tb\n"), ["echo", "a", "b"]);
        assert_eq!(ok("python3 -c 'print(1)'"), ["python3", "-c", "print(1)"]);
        assert_eq!(ok(r#"echo "a b" c"#), ["echo", "a b", "c"]);
        assert_eq!(ok(r#"a"b"'c'd"#), ["abcd"]);
        assert_eq!(ok(r"a\ b"), ["a b"]);
        assert_eq!(ok(r#""a\"b""#), [r#"a"b"#]);
        assert_eq!(ok(r#""a\$b""#), [r"a\$b"]);
        assert_eq!(ok(r"'a\b'"), [r"a\b"]);
        assert_eq!(ok("''"), [""]);
        assert_eq!(ok("a '' b"), ["a", "", "b"]);
        assert_eq!(
            ok("echo # not a comment"),
            ["echo", "#", "not", "a", "comment"]
        );
        assert_eq!(
            ok("sh -c 'sleep 1000 & sleep 1000'"),
            ["sh", "-c", "sleep 1000 & sleep 1000"]
        );
        assert!(ok("").is_empty());
        assert!(ok("   ").is_empty());
    }

    #[test]
    fn reports_pythons_errors() {
        assert_eq!(
            split("echo 'unterminated"),
            Err(SplitError::NoClosingQuotation)
        );
        assert_eq!(split(r#"echo "x"#), Err(SplitError::NoClosingQuotation));
        assert_eq!(split("echo \\"), Err(SplitError::NoEscapedCharacter));
        assert_eq!(split("\"a\\"), Err(SplitError::NoEscapedCharacter));
        assert_eq!(ok("a\\\nb"), ["a\nb"]);
        assert_eq!(
            SplitError::NoClosingQuotation.to_string(),
            "No closing quotation"
        );
    }
}

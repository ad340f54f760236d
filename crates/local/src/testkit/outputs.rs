//! Assertions on what a process or a directory ended up as: the one-line error every binary
//! prints (`agent_sandbox_api::exit`), and the files a client wrote.

use std::path::Path;
use std::process::Output;

/// Asserts that `output` is one error line (`error: ...`, no backtrace or panic text) with
/// exit status `code`, and returns the line.
#[track_caller]
pub fn one_error_line(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, not:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    let lower = stderr.to_ascii_lowercase();
    assert!(
        !lower.contains("backtrace") && !lower.contains("panicked"),
        "{stderr}"
    );
    lines[0].to_owned()
}

/// Asserts that `output` is a configuration error (exit status 2, one line) whose line
/// contains `names`.
#[track_caller]
pub fn assert_configuration_error(output: &Output, names: &str) {
    let line = one_error_line(output, i32::from(agent_sandbox_api::exit::CONFIGURATION));
    assert!(line.contains(names), "{names:?} not in {line:?}");
}

/// Every path under `root`, relative and sorted; symlinks are listed, never followed.
pub fn tree(root: &Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap_or(&path);
            found.push(relative.display().to_string());
            if entry.file_type()?.is_dir() {
                pending.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

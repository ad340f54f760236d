//! Rendering of listings: `-o table` (aligned columns, kubectl style), `-o json`, `-o yaml`.
//! Pure functions over rows and serializable values; the commands print what they return.

use serde::Serialize;

/// How a listing is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns with a header.
    #[default]
    Table,
    /// A JSON array (pretty-printed).
    Json,
    /// A YAML sequence.
    Yaml,
}

/// A table: a header and rows of cells, printed with columns padded to the widest cell and
/// separated by three spaces, as `kubectl get` does.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths.get(i).copied().unwrap_or(0)
                    - cell
                        .chars()
                        .count()
                        .min(widths.get(i).copied().unwrap_or(0));
                text.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `items` as JSON or YAML text (for `Format::Table` the caller renders its own table).
pub fn serialized<T: Serialize>(format: Format, items: &T) -> Result<String, String> {
    match format {
        Format::Json => serde_json::to_string_pretty(items)
            .map(|mut text| {
                text.push('\n');
                text
            })
            .map_err(|e| e.to_string()),
        Format::Yaml => serde_saphyr::to_string(items).map_err(|e| e.to_string()),
        Format::Table => Err("a table is rendered by its command".to_owned()),
    }
}

/// A short age like kubectl's: `45s`, `12m`, `3h`, `5d`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A duration as a flag would spell it: `1h`, `90m`, `45s`, `1500ms`.
pub fn duration(d: std::time::Duration) -> String {
    let seconds = d.as_secs();
    if d.subsec_nanos() != 0 {
        format!("{}ms", d.as_millis())
    } else if seconds != 0 && seconds.is_multiple_of(3600) {
        format!("{}h", seconds / 3600)
    } else if seconds != 0 && seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn durations_read_like_flags() {
        let d = std::time::Duration::from_millis;
        assert_eq!(duration(d(3_600_000)), "1h");
        assert_eq!(duration(d(5_400_000)), "90m");
        assert_eq!(duration(d(45_000)), "45s");
        assert_eq!(duration(d(1_500)), "1500ms");
    }

    #[test]
    fn columns_are_padded_to_the_widest_cell() {
        let text = table(
            &["NAME", "READY"],
            &[
                vec!["a-long-name".into(), "1/1".into()],
                vec!["b".into(), "0/1".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME          READY\na-long-name   1/1\nb             0/1\n"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(
            [age(5), age(300), age(7_300), age(200_000), age(-3)],
            ["5s", "5m", "2h", "2d", "0s"].map(String::from)
        );
    }
}

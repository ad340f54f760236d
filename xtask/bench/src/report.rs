//! Rows of results and the `docs/benchmarks.md` table they are merged into.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// One measured result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) median: String,
    pub(crate) p99: String,
    pub(crate) throughput: String,
    pub(crate) peak_rss: String,
    pub(crate) notes: String,
    pub(crate) date: String,
}

impl Row {
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            date: today(),
            ..Self::default()
        }
    }

    pub(crate) fn median(mut self, value: impl Into<String>) -> Self {
        self.median = value.into();
        self
    }

    pub(crate) fn p99(mut self, value: impl Into<String>) -> Self {
        self.p99 = value.into();
        self
    }

    pub(crate) fn throughput(mut self, value: impl Into<String>) -> Self {
        self.throughput = value.into();
        self
    }

    pub(crate) fn peak_rss(mut self, value: impl Into<String>) -> Self {
        self.peak_rss = value.into();
        self
    }

    pub(crate) fn notes(mut self, value: impl Into<String>) -> Self {
        self.notes = value.into();
        self
    }

    fn cells(&self) -> [&str; 7] {
        [
            &self.name,
            &self.median,
            &self.p99,
            &self.throughput,
            &self.peak_rss,
            &self.notes,
            &self.date,
        ]
    }

    /// The row as a markdown table line.
    pub(crate) fn to_line(&self) -> String {
        let cells: Vec<&str> = self
            .cells()
            .iter()
            .map(|c| if c.is_empty() { "–" } else { c })
            .collect();
        format!("| {} |", cells.join(" | "))
    }

    fn parse(line: &str) -> Option<Self> {
        let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
        let cells: Vec<String> = inner
            .split('|')
            .map(|cell| cell.trim())
            .map(|cell| {
                if cell == "–" {
                    String::new()
                } else {
                    cell.to_owned()
                }
            })
            .collect();
        let [name, median, p99, throughput, peak_rss, notes, date] =
            <[String; 7]>::try_from(cells).ok()?;
        Some(Self {
            name,
            median,
            p99,
            throughput,
            peak_rss,
            notes,
            date,
        })
    }
}

const TABLE_HEADER: &str = "| Case | Median | p99 | Throughput | Peak RSS | Notes | Date |";

/// Replaces the rows named like `rows` in the table of `path` (creating it if needed), keeps the
/// others, and rewrites the machine description.
pub(crate) fn merge_into(path: &Path, rows: &[Row]) -> Result<()> {
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    // What follows the table (sections written by hand, such as figures that come from the
    // end-to-end suite rather than from a case) is kept as it is.
    let mut after = String::new();
    if let Ok(existing) = std::fs::read_to_string(path) {
        let (mut in_table, mut past_table) = (false, false);
        for line in existing.lines() {
            if past_table {
                after.push_str(line);
                after.push('\n');
                continue;
            }
            if line.trim() == TABLE_HEADER {
                in_table = true;
                continue;
            }
            if in_table {
                if line.starts_with("|---") {
                    continue;
                }
                match Row::parse(line) {
                    Some(row) => {
                        table.insert(row.name.clone(), row);
                    }
                    None => {
                        in_table = false;
                        past_table = true;
                        after.push_str(line);
                        after.push('\n');
                    }
                }
            }
        }
    }
    for row in rows {
        table.insert(row.name.clone(), row.clone());
    }
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(
        "Written by `cargo xtask bench` (cases in `xtask/bench/src/`); re-measure one case with\n\
         `cargo xtask bench <case-prefix>` (`cargo xtask bench --list` names them). Latencies are\n\
         per operation; peak RSS is the high-water mark of the process measured. Figures are\n\
         from one machine and vary between runs; compare ratios measured in the same run. The\n\
         node tier's cases (`node/…`: as root, on a real node running our OCI images under runc\n\
         and gVisor) run only when named: `cargo xtask bench node/`.\n\n",
    );
    out.push_str(&format!("Machine of the last run: {}\n\n", machine()));
    out.push_str(TABLE_HEADER);
    out.push('\n');
    out.push_str("|---|---|---|---|---|---|---|\n");
    for row in table.values() {
        out.push_str(&row.to_line());
        out.push('\n');
    }
    out.push_str(&after);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("failed to create {}", parent.display()))?;
    }
    std::fs::write(path, out).with_context(|| format!("failed to write {}", path.display()))
}

/// Cores, CPU model and memory of this machine, from `/proc`.
pub(crate) fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let mem_gib = mem_kib as f64 / 1024.0 / 1024.0;
    format!(
        "{cores} cores ({model}), {mem_gib:.1} GiB memory, {}",
        std::env::consts::ARCH
    )
}

/// Today's UTC date as `YYYY-MM-DD`.
pub(crate) fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn rows_survive_a_merge() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        let path = dir.join("benchmarks.md");
        let first = Row::new("a/one").median("1 ms").p99("2 ms");
        let second = Row::new("b/two").throughput("5 req/s").notes("x");
        merge_into(&path, &[first.clone(), second.clone()]).unwrap();
        let updated = Row::new("a/one").median("3 ms");
        merge_into(&path, std::slice::from_ref(&updated)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&updated.to_line()), "{text}");
        assert!(text.contains(&second.to_line()), "{text}");
        assert!(!text.contains(&first.to_line()), "{text}");
        // A section after the table survives the next merge.
        let section = "\n## By hand\n\nKept as written.\n";
        std::fs::write(&path, format!("{text}{section}")).unwrap();
        merge_into(&path, std::slice::from_ref(&updated)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with(section), "{text}");
        assert!(text.contains(&second.to_line()), "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

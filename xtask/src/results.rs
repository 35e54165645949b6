//! Benchmark results as data: one JSON object a line, one line a figure (bench/README.md).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// One measured figure, as the GPU benchmarks write it and `bench-report` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The path measured: the benchmark's name (`rt-ab`, `g2g`, `bulk`, ...); one table each.
    pub test: String,
    /// What was measured on that path, unique within the test on one GPU.
    pub figure: String,
    /// The figure's value, in `unit`.
    pub value: f64,
    /// The unit; one ending in `/s` is a rate (higher is better), any other a cost (lower is better).
    pub unit: String,
    /// The raw baseline measured in the same run, where the path has one.
    pub raw_limit: Option<RawLimit>,
    /// Relative spread of the figure across the run's turns (0.05: 5%), where it was measured.
    pub noise: Option<f64>,
    /// The GPU's name as the driver gives it.
    pub gpu: String,
    /// The NVIDIA driver's version.
    pub driver: String,
    /// The commit the measured binaries were built from.
    pub commit: String,
    /// The one command that reproduces the figure.
    pub command: String,
    /// When it was measured: an RFC 3339 UTC time, or a date.
    pub date: String,
}

/// The raw baseline a figure stands beside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    /// What the baseline is (say "raw LL exchange").
    pub name: String,
    /// Its value, in the figure's unit.
    pub value: f64,
}

impl Record {
    /// Whether a larger value is better (a rate) rather than worse (a time, a ratio of costs).
    pub fn higher_is_better(&self) -> bool {
        self.unit.ends_with("/s")
    }

    /// The figure over its raw limit, where it has one with a non-zero value.
    pub fn ratio(&self) -> Option<f64> {
        self.raw_limit.as_ref().filter(|r| r.value != 0.0).map(|r| self.value / r.value)
    }

    /// What identifies a figure across runs: the path, the GPU and the figure's name.
    pub fn key(&self) -> (String, String, String) {
        (self.test.clone(), self.gpu.clone(), self.figure.clone())
    }

    fn check(&self) -> Result<()> {
        for (name, v) in [("test", &self.test), ("figure", &self.figure), ("unit", &self.unit), ("gpu", &self.gpu)] {
            if v.trim().is_empty() {
                bail!("field {name:?} is empty");
            }
        }
        if !self.value.is_finite() {
            bail!("value {} is not a finite number", self.value);
        }
        if let Some(n) = self.noise
            && !(n.is_finite() && n >= 0.0)
        {
            bail!("noise {n} is not a finite number >= 0");
        }
        if let Some(r) = &self.raw_limit
            && !r.value.is_finite()
        {
            bail!("raw_limit {:?} has a value that is not a finite number", r.name);
        }
        Ok(())
    }
}

/// Parses results text: one record a non-blank line; an error names `origin`, the line and the reason.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: Record =
            serde_json::from_str(line).with_context(|| format!("{origin}:{}: not a results record", i + 1))?;
        record.check().with_context(|| format!("{origin}:{}: bad results record", i + 1))?;
        out.push(record);
    }
    Ok(out)
}

/// Reads one results file.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading results file {}", path.display()))?;
    parse(&text, &path.display().to_string())
}

/// The newest record of every figure (by date, a later file or line winning a tie), in the order the
/// figures first appear.
pub fn latest(records: &[Record]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    for r in records {
        match out.iter_mut().find(|o| o.key() == r.key()) {
            Some(o) if r.date >= o.date => *o = r.clone(),
            Some(_) => {}
            None => out.push(r.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(figure: &str, value: f64, date: &str) -> String {
        format!(
            r#"{{"test":"rt-ab","figure":"{figure}","value":{value},"unit":"us","raw_limit":null,"noise":null,"gpu":"G","driver":"1","commit":"abc","command":"c","date":"{date}"}}"#
        )
    }

    #[test]
    fn parses_and_keeps_the_newest_of_each_figure() {
        let text =
            [line("a", 2.0, "2026-12-05"), String::new(), line("b", 3.0, "2026-12-05"), line("a", 1.5, "2026-12-06")]
                .join("\n");
        let records = parse(&text, "t.jsonl").unwrap();
        assert_eq!(records.len(), 3);
        let newest = latest(&records);
        assert_eq!(newest.iter().map(|r| (r.figure.as_str(), r.value)).collect::<Vec<_>>(), [("a", 1.5), ("b", 3.0)]);
    }

    #[test]
    fn a_bad_line_is_named_with_its_reason() {
        let text = format!("{}\n{{\"test\":1}}\n", line("a", 2.0, "2026-12-05"));
        let err = format!("{:#}", parse(&text, "x.jsonl").unwrap_err());
        assert!(err.contains("x.jsonl:2"), "{err}");
        let empty = line("", 2.0, "2026-12-05");
        let err = format!("{:#}", parse(&empty, "y.jsonl").unwrap_err());
        assert!(err.contains("y.jsonl:1") && err.contains("\"figure\" is empty"), "{err}");
    }
}

//! The benchmark's results file: one JSON line a figure, in the format bench/README.md describes and
//! `cargo xtask bench-report` reads (xtask's `results::Record`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Where this run's records go, and what every record says about the run.
struct Sink {
    path: PathBuf,
    gpu: String,
    driver: String,
    commit: String,
    command: String,
    date: String,
}

static SINK: OnceLock<Mutex<Sink>> = OnceLock::new();

/// Sets up the results file for this process: `path`, else `target/bench-results/DATE-GPU.jsonl`;
/// `bench_args` are the benchmark's own arguments (the command that reproduces the run).
pub fn init(path: Option<PathBuf>, commit: Option<String>, bench_args: &[String]) {
    let (gpu, driver) = gpu_and_driver();
    let date = now_utc();
    let path = path.unwrap_or_else(|| {
        let gpu_tag: String =
            gpu.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        PathBuf::from(format!("target/bench-results/{}-{gpu_tag}.jsonl", &date[..10]))
    });
    let commit = commit.or_else(git_commit).unwrap_or_else(|| "unknown".into());
    let command = ["cargo xtask bench".to_string()].into_iter().chain(bench_args.iter().cloned()).collect::<Vec<_>>();
    let sink = Sink { path, gpu, driver, commit, command: command.join(" "), date };
    println!("results: {}", sink.path.display());
    let _ = SINK.set(Mutex::new(sink));
}

/// Appends one figure to the results file: `value` in `unit`, beside `raw` (the baseline's name and value,
/// measured in the same run) and with its `noise` (relative spread across turns) where known. A file
/// that cannot be written is said on stderr once a record; the printed tables still stand.
pub fn record(test: &str, figure: &str, value: f64, unit: &str, raw: Option<(&str, f64)>, noise: Option<f64>) {
    let Some(sink) = SINK.get() else { return };
    let sink = sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let line = serde_json::json!({
        "test": test,
        "figure": figure,
        "value": round(value),
        "unit": unit,
        "raw_limit": raw.map(|(name, v)| serde_json::json!({"name": name, "value": round(v)})),
        "noise": noise.map(|n| (n * 1000.0).round() / 1000.0),
        "gpu": sink.gpu,
        "driver": sink.driver,
        "commit": sink.commit,
        "command": sink.command,
        "date": sink.date,
    });
    if !value.is_finite() {
        eprintln!("results: {test} | {figure}: {value} is not a number; not recorded");
        return;
    }
    if let Some(dir) = sink.path.parent()
        && !dir.as_os_str().is_empty()
    {
        let _ = std::fs::create_dir_all(dir);
    }
    let written =
        std::fs::OpenOptions::new().create(true).append(true).open(&sink.path).and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("results: cannot append to {}: {e}", sink.path.display());
    }
}

/// Relative spread of per-turn values: (highest − lowest) / median.
pub fn spread(turns: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = turns.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    (median > 0.0).then(|| (v[v.len() - 1] - v[0]) / median)
}

/// Four significant digits, whole numbers from 1000 up: what the tables print, without float noise in
/// the file.
fn round(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    if v.abs() >= 1000.0 {
        return v.round();
    }
    #[allow(clippy::cast_possible_truncation, reason = "the log10 of a finite non-zero f64 lies within ±330")]
    let scale = 10f64.powi(3 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// The GPU's name and the driver's version, from nvidia-smi (device 0, the one the benchmarks use).
fn gpu_and_driver() -> (String, String) {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"])
        .output();
    if let Ok(out) = out
        && out.status.success()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some((name, driver)) = text.trim().split_once(',') {
            return (name.trim().to_string(), driver.trim().to_string());
        }
    }
    ("unknown GPU".into(), "unknown".into())
}

fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Now as RFC 3339 UTC, to the second.
fn now_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_every_field_of_the_results_format_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        init(Some(path.clone()), Some("abc1234".into()), &["rt-ab".into(), "blink".into()]);
        record(
            "rt-ab",
            "echo_header, blink, 8 B",
            2.444_449,
            "µs",
            Some(("raw LL exchange", 2.3)),
            spread(&[2.4, 2.5, 2.3]),
        );
        record("rt-ab", "not a number", f64::NAN, "µs", None, None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        // bench/README.md's fields, which xtask's results::Record reads (refusing any other).
        let fields =
            ["command", "commit", "date", "driver", "figure", "gpu", "noise", "raw_limit", "test", "unit", "value"];
        assert_eq!(keys, fields);
        assert_eq!(v["value"], 2.444);
        assert_eq!(v["raw_limit"]["name"], "raw LL exchange");
        assert_eq!(v["noise"], 0.083);
        assert_eq!(v["commit"], "abc1234");
        assert_eq!(v["command"], "cargo xtask bench rt-ab blink");
        let date = v["date"].as_str().unwrap();
        assert!(date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T', "{date}");
    }

    #[test]
    fn spread_and_rounding() {
        assert_eq!(spread(&[2.0]), None);
        assert!((spread(&[2.0, 2.2, 2.1]).unwrap() - 0.2 / 2.1).abs() < 1e-12);
        assert!((round(15_350_790.4) - 15_350_790.0).abs() < 1e-6);
        assert!((round(950.53) - 950.5).abs() < 1e-9);
        assert!((round(0.036_94) - 0.036_94).abs() < 1e-12);
    }
}

//! `DIR/study.csv`: one row per finished run, appended (and flushed to disk) as each run ends,
//! so an interrupted study loses at most the run in flight and a resumed one reads back what
//! it has. A row torn by a crash mid-write (no final newline) is dropped on reading.
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

pub const HEADER: &str = "run,round,config,kind,warmup,seed,ok,exit,wall_s,metric,tail_metric,\
table_mean_us,table_sd_us,delayed,injected_mean_us,note";

/// One finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub run: usize,
    /// Empty for warm-up runs.
    pub round: Option<usize>,
    pub config: String,
    pub kind: String,
    pub warmup: bool,
    /// The injector's seed (IBJITTER_SEED) for table runs.
    pub seed: u64,
    /// Whether the run counts: exit 0, metric found, perturbation in place throughout.
    pub ok: bool,
    /// The program's exit status (or `signal N`, `timeout`).
    pub exit: String,
    pub wall_s: f64,
    /// The metric (`--metric`, else the wall time), NaN when it could not be read.
    pub metric: f64,
    pub tail_metric: f64,
    pub table_mean_us: f64,
    pub table_sd_us: f64,
    /// Sends the injector delayed (summed over the run's processes); 0 for clean runs.
    pub delayed: u64,
    /// Mean delay the injector actually drew, µs (NaN when it drew none).
    pub injected_mean_us: f64,
    /// Why a run does not count, or what to know about it.
    pub note: String,
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

/// A note never breaks the CSV: commas and newlines become spaces.
fn clean_note(s: &str) -> String {
    s.chars()
        .map(|c| {
            if matches!(c, ',' | '\n' | '\r' | '"') {
                ' '
            } else {
                c
            }
        })
        .collect()
}

impl Row {
    /// Whether the run counts in the figures: measured (not warm-up) and valid.
    pub fn counts(&self) -> bool {
        self.ok && !self.warmup
    }

    /// A counted run of `config` that measured `metric` (tests fill in the rest).
    #[cfg(test)]
    pub fn counted(run: usize, config: &str, kind: &str, metric: f64) -> Row {
        Row {
            run,
            round: Some(run),
            config: config.into(),
            kind: kind.into(),
            warmup: false,
            seed: 0,
            ok: true,
            exit: "0".into(),
            wall_s: metric,
            metric,
            tail_metric: f64::NAN,
            table_mean_us: 0.0,
            table_sd_us: 0.0,
            delayed: 0,
            injected_mean_us: f64::NAN,
            note: String::new(),
        }
    }

    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            self.run,
            self.round.map(|r| r.to_string()).unwrap_or_default(),
            clean_note(&self.config),
            self.kind,
            u8::from(self.warmup),
            self.seed,
            u8::from(self.ok),
            clean_note(&self.exit),
            num(self.wall_s),
            num(self.metric),
            num(self.tail_metric),
            num(self.table_mean_us),
            num(self.table_sd_us),
            self.delayed,
            num(self.injected_mean_us),
            clean_note(&self.note),
        )
    }

    fn from_csv(line: &str, origin: &str) -> Result<Row, String> {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 16 {
            return Err(format!(
                "{origin}: expected 16 comma-separated fields ({HEADER}), found {}",
                f.len()
            ));
        }
        let bad = |what: &str, v: &str| format!("{origin}: {what} {v:?} is not a number");
        let int = |i: usize, what: &str| f[i].parse::<u64>().map_err(|_| bad(what, f[i]));
        let real = |i: usize, what: &str| {
            if f[i].is_empty() {
                Ok(f64::NAN)
            } else {
                f[i].parse::<f64>().map_err(|_| bad(what, f[i]))
            }
        };
        Ok(Row {
            run: int(0, "run")? as usize,
            round: if f[1].is_empty() {
                None
            } else {
                Some(int(1, "round")? as usize)
            },
            config: f[2].to_string(),
            kind: f[3].to_string(),
            warmup: f[4] == "1",
            seed: int(5, "seed")?,
            ok: f[6] == "1",
            exit: f[7].to_string(),
            wall_s: real(8, "wall_s")?,
            metric: real(9, "metric")?,
            tail_metric: real(10, "tail_metric")?,
            table_mean_us: real(11, "table_mean_us")?,
            table_sd_us: real(12, "table_sd_us")?,
            delayed: int(13, "delayed")?,
            injected_mean_us: real(14, "injected_mean_us")?,
            note: f[15].to_string(),
        })
    }
}

/// The runs of `config` that count.
pub fn counted<'a, 'b>(
    rows: &'a [Row],
    config: &'b str,
) -> impl Iterator<Item = &'a Row> + use<'a, 'b> {
    rows.iter()
        .filter(move |r| r.counts() && r.config == config)
}

/// The metrics of the runs of `config` that count, in run order.
pub fn counted_metrics(rows: &[Row], config: &str) -> Vec<f64> {
    counted(rows, config).map(|r| r.metric).collect()
}

/// Reads the rows a study has written (none if the file does not exist). A last line without
/// its newline is a run torn by a crash: dropped, and the file cut back to the rows kept.
pub fn load(path: &Path) -> Result<Vec<Row>, String> {
    // The study's own record: a regular file, as its writer requires ([`Writer::open`]).
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "{}: not a regular file (a study's record is one; a FIFO there would wait for a \
             reader)",
            path.display()
        ));
    }
    let Some(text) = crate::table::input::read_text_if_present(
        path,
        "a study's CSV",
        crate::table::input::LIMITS,
    )
    .map_err(|e| e.to_string())?
    else {
        return Ok(Vec::new());
    };
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    if complete.len() != text.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.set_len(complete.len() as u64)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut rows = Vec::new();
    for (i, line) in complete.lines().enumerate() {
        if i == 0 {
            if line != HEADER {
                return Err(format!(
                    "{}:1: expected the header {HEADER:?}: not a study's CSV",
                    path.display()
                ));
            }
            continue;
        }
        let origin = format!("{}:{}", path.display(), i + 1);
        let row = Row::from_csv(line, &origin)?;
        if row.run != rows.len() {
            return Err(format!(
                "{origin}: expected run {}, found run {}",
                rows.len(),
                row.run
            ));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The CSV, open for appending; the header written if the file is new.
pub struct Writer {
    file: File,
}

impl Writer {
    pub fn open(path: &Path) -> Result<Writer, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let err = |e: io::Error| format!("{}: {e}", path.display());
        let not_regular = || {
            format!(
                "{}: not a regular file (a study's record is one; a FIFO there would wait \
                 for a reader)",
                path.display()
            )
        };
        if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
            return Err(not_regular());
        }
        // The study's own record: a regular file, never a link. A FIFO put there made this
        // open wait for a reader (restarted after Ctrl-C: only SIGKILL ended it).
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                // Made a FIFO (or a link) since the look above.
                Some(libc::ENXIO | libc::ELOOP) => not_regular(),
                _ => err(e),
            })?;
        if !file.metadata().map_err(err)?.is_file() {
            return Err(not_regular());
        }
        // Appends block again.
        crate::table::input::clear_nonblock(&file).map_err(err)?;
        if file.metadata().map_err(err)?.len() == 0 {
            file.write_all(format!("{HEADER}\n").as_bytes())
                .map_err(err)?;
        }
        Ok(Writer { file })
    }

    /// Appends a row in one write and syncs it: a finished run survives a crash that follows.
    pub fn append(&mut self, row: &Row) -> io::Result<()> {
        self.file.write_all(row.to_csv().as_bytes())?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(run: usize) -> Row {
        Row {
            run,
            round: if run == 0 { None } else { Some(run - 1) },
            config: "heavy,scale25".into(),
            kind: "table".into(),
            warmup: run == 0,
            seed: 42,
            ok: true,
            exit: "0".into(),
            wall_s: 1.25,
            metric: 1.25,
            tail_metric: f64::NAN,
            table_mean_us: 50.0,
            table_sd_us: 12.5,
            delayed: 1000,
            injected_mean_us: 49.9,
            note: "a note, with a comma".into(),
        }
    }

    #[test]
    fn rows_round_trip_and_a_torn_last_row_is_dropped() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("study.csv");
        let _ = std::fs::remove_file(&path);
        let mut w = Writer::open(&path).unwrap();
        w.append(&row(0)).unwrap();
        w.append(&row(1)).unwrap();
        drop(w);
        // A crash in the middle of the third row.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"2,1,clean,clean,0,4").unwrap();
        drop(f);
        let rows = load(&path).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].config, "heavy scale25");
        assert_eq!(rows[1].note, "a note  with a comma");
        assert!(rows[1].tail_metric.is_nan());
        assert_eq!(rows[1].round, Some(0));
        assert_eq!(rows[0].round, None);
        // The torn row is gone from the file too: appending goes on from a clean line.
        let mut w = Writer::open(&path).unwrap();
        w.append(&row(2)).unwrap();
        assert_eq!(load(&path).unwrap().len(), 3);
        std::fs::write(&path, "x,y\n").unwrap();
        assert!(load(&path).unwrap_err().contains("not a study's CSV"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

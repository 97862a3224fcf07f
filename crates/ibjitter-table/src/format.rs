//! The table file format: 4096 integers, written as 512 lines of 8, the shape of tc netem's
//! `.dist` files, optionally preceded by `#` comment lines.
//!
//! This module depends on `std` only: the LD_PRELOAD shim reads tables through it without
//! pulling in the generators or libibverbs.
//!
//! Reading is lenient about layout (any whitespace between the 4096 integers, as tc accepts)
//! and strict about content: every problem is reported as `origin:line:col: message`, where
//! the message says what was expected and what was found.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Number of entries in a table: 512 lines of 8.
pub const ENTRIES: usize = 4096;
/// Entries per written line.
pub const PER_LINE: usize = 8;
/// netem's fixed-point scale: a netem entry `e` stands for `e / 8192` standard deviations.
pub const NETEM_SCALE: f64 = 8192.0;

/// What a table's entries mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Each entry is a delay in nanoseconds (a non-negative integer).
    Absolute,
    /// tc netem's normalized form: entries are a mean-0, sd-1 distribution scaled by 8192 and
    /// stored as `i16`; the delay is `mu + sigma * entry / 8192`.
    Netem,
}

impl Kind {
    /// The smallest and largest value an entry of this kind may hold.
    pub fn range(self) -> (i64, i64) {
        match self {
            Kind::Absolute => (0, i64::MAX),
            Kind::Netem => (i64::from(i16::MIN), i64::from(i16::MAX)),
        }
    }
}

/// A delay table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub kind: Kind,
    /// Always [`ENTRIES`] long.
    pub entries: Vec<i64>,
    /// Header `#` lines, without the `#` (and without one space following it, if present).
    pub comments: Vec<String>,
}

/// A table that could not be read: where, and what was expected.
///
/// `line` and `col` are 1-based (`col` counts characters). An error that has no position
/// (an I/O error opening the file) has `line == 0` and `col == 0` and displays as
/// What kind of problem an error is, for callers that react to one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read (missing, not a regular file, too large).
    Io,
    /// The text is not what was expected: a token, the number of values, the encoding.
    Syntax,
    /// A negative entry where delays are expected (a netem table read as an absolute one).
    Negative,
    /// Values that make no table: bad parameters, a fit that cannot be done.
    Invalid,
}

/// `origin: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub kind: ErrorKind,
    pub origin: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.origin, self.line, self.col, self.message
            )
        }
    }
}

impl std::error::Error for ParseError {}

/// Longest piece of an offending token quoted in an error message.
const QUOTE_MAX: usize = 24;

fn quote(token: &str) -> String {
    let mut out: String = token.chars().take(QUOTE_MAX).collect();
    if token.chars().count() > QUOTE_MAX {
        out.push('…');
    }
    format!("{out:?}")
}

/// Parses a table from text.
///
/// Accepts any whitespace layout of exactly [`ENTRIES`] integers. Lines whose first
/// non-blank character is `#` are comments (as tc skips them); those before the first number
/// are kept in [`Table::comments`], later ones are ignored. `origin` names the source in errors.
pub fn parse(text: &str, kind: Kind, origin: &str) -> Result<Table, ParseError> {
    let err = |line: usize, col: usize, message: String| ParseError {
        kind: ErrorKind::Syntax,
        origin: origin.to_string(),
        line,
        col,
        message,
    };
    let (min, max) = kind.range();
    let mut entries = Vec::with_capacity(ENTRIES);
    let mut comments = Vec::new();
    let mut last_line = 1;
    let mut last_col = 1;

    for (idx, raw_line) in text.split('\n').enumerate() {
        let line_no = idx + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        let trimmed = line.trim_start();
        if let Some(comment) = trimmed.strip_prefix('#') {
            if entries.is_empty() {
                comments.push(comment.strip_prefix(' ').unwrap_or(comment).to_string());
            }
            continue;
        }
        // Tokens: maximal runs of non-whitespace, with their 1-based character column.
        let mut chars = line.char_indices().peekable();
        let mut col = 0usize;
        while let Some(&(start, c)) = chars.peek() {
            if c.is_whitespace() {
                chars.next();
                col += 1;
                continue;
            }
            let tok_col = col + 1;
            let mut end = start;
            while let Some(&(i, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                end = i + c.len_utf8();
                chars.next();
                col += 1;
            }
            let token = &line[start..end];
            if entries.len() == ENTRIES {
                return Err(err(
                    line_no,
                    tok_col,
                    format!(
                        "expected exactly {ENTRIES} values, found more (value {} is {})",
                        ENTRIES + 1,
                        quote(token)
                    ),
                ));
            }
            let value = parse_int(token).map_err(|e| {
                let what = match kind {
                    Kind::Absolute => "a delay in nanoseconds (non-negative integer)",
                    Kind::Netem => "a netem table entry (integer)",
                };
                let message = match e {
                    IntError::NotInteger => format!(
                        "expected {what} for value {}, found {}",
                        entries.len() + 1,
                        quote(token)
                    ),
                    IntError::Overflow => format!(
                        "expected {what} in {min}..={max} for value {}, found {} (overflow)",
                        entries.len() + 1,
                        quote(token)
                    ),
                };
                err(line_no, tok_col, message)
            })?;
            if value < min || value > max {
                let message = match kind {
                    Kind::Absolute if value < 0 => format!(
                        "expected a non-negative delay in nanoseconds for value {}, found {value}",
                        entries.len() + 1
                    ),
                    Kind::Absolute => format!(
                        "expected a delay in nanoseconds in {min}..={max} for value {}, found {value} (overflow)",
                        entries.len() + 1
                    ),
                    Kind::Netem => format!(
                        "expected a netem entry in {min}..={max} (i16) for value {}, found {value} (overflow)",
                        entries.len() + 1
                    ),
                };
                let mut e = err(line_no, tok_col, message);
                if kind == Kind::Absolute && value < 0 {
                    e.kind = ErrorKind::Negative;
                }
                return Err(e);
            }
            entries.push(value);
        }
        last_line = line_no;
        last_col = col + 1;
    }

    if entries.len() != ENTRIES {
        return Err(err(
            last_line,
            last_col,
            format!(
                "expected exactly {ENTRIES} values (512 lines of 8), found only {} before the end of input",
                entries.len()
            ),
        ));
    }
    Ok(Table {
        kind,
        entries,
        comments,
    })
}

enum IntError {
    NotInteger,
    Overflow,
}

/// A decimal integer with an optional sign. Distinguishes "not an integer" from "too large",
/// which `str::parse` lumps together for our purposes.
fn parse_int(token: &str) -> Result<i64, IntError> {
    let digits = token.strip_prefix(['-', '+']).unwrap_or(token);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IntError::NotInteger);
    }
    // i128 holds any i64 plus sign; longer digit strings are overflow either way.
    if digits.len() > 30 {
        return Err(IntError::Overflow);
    }
    let wide: i128 = token.parse().map_err(|_| IntError::NotInteger)?;
    i64::try_from(wide).map_err(|_| IntError::Overflow)
}

/// The largest table file read, in bytes: 4096 entries with comments take tens of KiB, so
/// anything larger is not a table (and reading a device such as /dev/zero whole would never end).
pub const MAX_TABLE_BYTES: u64 = 1 << 20;

/// Reads a small file (a table, a seed) that may have been named by mistake: opened
/// non-blocking (a FIFO does not wait for a writer), only a regular file is read (not a
/// directory, device, FIFO or socket), and at most `max` bytes.
pub fn read_small_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    let t = meta.file_type();
    let refuse = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("expected a regular file, found {what}"),
        )
    };
    if t.is_dir() {
        return Err(refuse("a directory"));
    } else if t.is_fifo() {
        return Err(refuse("a FIFO"));
    } else if t.is_char_device() || t.is_block_device() {
        return Err(refuse("a device"));
    } else if t.is_socket() {
        return Err(refuse("a socket"));
    } else if !t.is_file() {
        return Err(refuse("something else"));
    }
    let too_large = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("larger than {max} bytes: not a table"),
        )
    };
    if meta.len() > max {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow after fstat: read at most one byte past the limit.
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Reads and parses a table file ([`read_small_file`]: a regular file of at most
/// [`MAX_TABLE_BYTES`]). I/O errors and invalid UTF-8 are reported as [`ParseError`]s naming
/// the path (invalid UTF-8 with the position of the first bad byte).
pub fn read(path: &Path, kind: Kind) -> Result<Table, ParseError> {
    let origin = path.display().to_string();
    let bytes = read_small_file(path, MAX_TABLE_BYTES).map_err(|e| ParseError {
        kind: ErrorKind::Io,
        origin: origin.clone(),
        line: 0,
        col: 0,
        message: format!("cannot read table: {e}"),
    })?;
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) => text,
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            // valid_up_to() is a char boundary, so this prefix is valid UTF-8.
            let good = std::str::from_utf8(good).unwrap_or_default();
            let line = good.matches('\n').count() + 1;
            let col = good.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            return Err(ParseError {
                kind: ErrorKind::Syntax,
                origin,
                line,
                col,
                message: "expected text (UTF-8), found an invalid byte".to_string(),
            });
        }
    };
    parse(text, kind, &origin)
}

impl Table {
    /// Writes the table: each comment as a `# ` line (a comment containing newlines becomes
    /// several), then 512 lines of 8 space-separated integers.
    ///
    /// Fails with `InvalidData` if `entries` is not [`ENTRIES`] long.
    pub fn write<W: Write>(&self, w: W) -> io::Result<()> {
        if self.entries.len() != ENTRIES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a table has {ENTRIES} entries, this one has {}",
                    self.entries.len()
                ),
            ));
        }
        let mut w = io::BufWriter::new(w);
        for comment in &self.comments {
            for line in comment.split('\n') {
                if line.is_empty() {
                    writeln!(w, "#")?;
                } else {
                    writeln!(w, "# {line}")?;
                }
            }
        }
        for row in self.entries.chunks(PER_LINE) {
            let mut first = true;
            for v in row {
                if !first {
                    w.write_all(b" ")?;
                }
                write!(w, "{v}")?;
                first = false;
            }
            w.write_all(b"\n")?;
        }
        w.flush()
    }

    /// The table written to a string (see [`Table::write`]).
    pub fn to_text(&self) -> io::Result<String> {
        let mut out = Vec::new();
        self.write(&mut out)?;
        String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The delays, in nanoseconds, that a netem-format table stands for with mean `mu_ns` and
    /// deviation `sigma_ns`: `mu + sigma * entry / 8192`, rounded, negative values clamped to 0.
    pub fn netem_delays_ns(&self, mu_ns: f64, sigma_ns: f64) -> Vec<u64> {
        self.entries
            .iter()
            .map(|&e| {
                let d = (mu_ns + sigma_ns * e as f64 / NETEM_SCALE).round();
                if d > 0.0 {
                    // `as` saturates at u64::MAX for huge values.
                    d as u64
                } else {
                    0 // negative, zero, or NaN
                }
            })
            .collect()
    }
}

/// System directories where iproute2 installs its `.dist` files.
pub const SYSTEM_DIST_DIRS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/tc",
    "/usr/lib/tc",
    "/usr/lib64/tc",
];

/// Environment variable naming a directory of tables that takes precedence over the
/// project's `distributions/`.
pub const DISTRIBUTIONS_ENV: &str = "IBJITTER_DISTRIBUTIONS";

/// Finds a named table (`"normal"`, `"pareto"`, …; a trailing `.dist` is allowed).
///
/// Looks for `<name>.dist` in, in order: the directory named by `IBJITTER_DISTRIBUTIONS`
/// (if set), the project's `distributions/` (located at compile time), then iproute2's
/// directories ([`SYSTEM_DIST_DIRS`]). Names containing path separators or `..` are refused.
pub fn resolve_named_dist(name: &str) -> Option<PathBuf> {
    let stem = name.strip_suffix(".dist").unwrap_or(name);
    if stem.is_empty()
        || stem.contains('/')
        || stem.contains('\\')
        || stem.contains('\0')
        || stem.starts_with('.')
    {
        return None;
    }
    let file = format!("{stem}.dist");
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os(DISTRIBUTIONS_ENV) {
        if !dir.is_empty() {
            dirs.push(PathBuf::from(dir));
        }
    }
    // The checkout's distributions/ (this crate lives in crates/ibjitter-table).
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../distributions"));
    dirs.into_iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .or_else(|| iproute2_dist(stem))
}

/// iproute2's own copy of `<name>.dist`, from [`SYSTEM_DIST_DIRS`].
pub fn iproute2_dist(name: &str) -> Option<PathBuf> {
    SYSTEM_DIST_DIRS
        .iter()
        .map(|d| Path::new(d).join(format!("{name}.dist")))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(kind: Kind) -> Table {
        let entries = (0..ENTRIES as i64)
            .map(|i| match kind {
                Kind::Absolute => i * 1000 + 7,
                Kind::Netem => i * 16 - 32768,
            })
            .collect();
        Table {
            kind,
            entries,
            comments: vec!["made by a test".into(), String::new(), "x=1 ns".into()],
        }
    }

    #[test]
    fn write_then_parse_round_trips() {
        for kind in [Kind::Absolute, Kind::Netem] {
            let t = ramp(kind);
            let text = t.to_text().unwrap();
            let back = parse(&text, kind, "t").unwrap();
            assert_eq!(back, t);
            // 3 comment lines + 512 data lines of 8.
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 3 + ENTRIES / PER_LINE);
            assert_eq!(lines[0], "# made by a test");
            assert_eq!(lines[1], "#");
            assert!(lines[3..]
                .iter()
                .all(|l| l.split(' ').count() == PER_LINE && !l.starts_with(' ')));
        }
    }

    #[test]
    fn accepts_any_whitespace_layout_and_crlf() {
        let t = ramp(Kind::Absolute);
        let text: String = t
            .entries
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i % 5 == 0 {
                    format!("\t{v}\r\n")
                } else {
                    format!("  {v}")
                }
            })
            .collect();
        let back = parse(&text, Kind::Absolute, "t").unwrap();
        assert_eq!(back.entries, t.entries);
        assert!(back.comments.is_empty());
    }

    #[test]
    fn later_comments_are_skipped_not_kept() {
        let mut text = String::from("#head\n");
        for i in 0..ENTRIES {
            if i == 100 {
                text.push_str("\n  # middle\n");
            }
            text.push_str(&format!("{i} "));
        }
        let t = parse(&text, Kind::Absolute, "t").unwrap();
        assert_eq!(t.comments, vec!["head".to_string()]);
        assert_eq!(t.entries[4095], 4095);
    }

    fn err_of(text: &str, kind: Kind) -> ParseError {
        parse(text, kind, "f.dist").unwrap_err()
    }

    fn numbers(n: usize) -> String {
        let mut s = String::new();
        for i in 0..n {
            s.push_str(&i.to_string());
            s.push(if i % 8 == 7 { '\n' } else { ' ' });
        }
        s
    }

    #[test]
    fn too_few_values() {
        let e = err_of(&numbers(4095), Kind::Absolute);
        assert!(e.message.contains("found only 4095"), "{e}");
        assert_eq!(e.line, 512);
        let e = err_of("", Kind::Netem);
        assert_eq!((e.line, e.col), (1, 1));
        assert!(e
            .to_string()
            .starts_with("f.dist:1:1: expected exactly 4096"));
    }

    #[test]
    fn too_many_values_points_at_the_extra_one() {
        let mut text = numbers(4096);
        text.push_str("  77\n");
        let e = err_of(&text, Kind::Absolute);
        assert_eq!((e.line, e.col), (513, 3), "{e}");
        assert!(e.message.contains("found more") && e.message.contains("\"77\""));
    }

    #[test]
    fn non_integer_with_position() {
        let mut text = numbers(4096);
        text = text.replacen("10 11", "10 1.5", 1); // line 2, tokens "8 9 10 1.5"
        let e = err_of(&text, Kind::Absolute);
        assert_eq!((e.line, e.col), (2, 8), "{e}");
        assert!(e.message.contains("\"1.5\"") && e.message.contains("expected"));
        let e = err_of("12 abc", Kind::Netem);
        assert_eq!((e.line, e.col), (1, 4));
        let e = err_of("é x", Kind::Netem);
        assert_eq!((e.line, e.col), (1, 1));
        let e = err_of("é -", Kind::Netem);
        assert_eq!(e.col, 1);
        let e = err_of("1 2 -", Kind::Netem);
        assert_eq!(e.col, 5);
    }

    #[test]
    fn negative_absolute_rejected_but_fine_for_netem() {
        let text = format!("-3 {}", numbers(4095));
        let e = err_of(&text, Kind::Absolute);
        assert_eq!((e.line, e.col), (1, 1));
        assert!(e.message.contains("non-negative"), "{e}");
        assert_eq!(e.kind, ErrorKind::Negative);
        // Other refusals are of other kinds.
        assert_eq!(err_of("1 2 x", Kind::Absolute).kind, ErrorKind::Syntax);
        assert_eq!(
            read(Path::new("/nonexistent/table"), Kind::Absolute)
                .unwrap_err()
                .kind,
            ErrorKind::Io
        );
        assert_eq!(parse(&text, Kind::Netem, "f").unwrap().entries[0], -3);
    }

    #[test]
    fn overflow() {
        let text = format!("{} 32768", numbers(4095));
        let e = err_of(&text, Kind::Netem);
        assert!(
            e.message.contains("i16") && e.message.contains("32768"),
            "{e}"
        );
        let e = err_of(&format!("{} -32769", numbers(4095)), Kind::Netem);
        assert!(e.message.contains("overflow"), "{e}");
        assert!(parse(&format!("{} -32768", numbers(4095)), Kind::Netem, "f").is_ok());
        let e = err_of("9223372036854775808", Kind::Absolute);
        assert!(e.message.contains("overflow"), "{e}");
        let e = err_of(&"9".repeat(400), Kind::Absolute);
        assert!(e.message.contains("overflow"), "{e}");
        let text = format!("{} 9223372036854775807", numbers(4095));
        assert_eq!(
            parse(&text, Kind::Absolute, "f").unwrap().entries[4095],
            i64::MAX
        );
    }

    #[test]
    fn read_reports_path_and_bad_utf8() {
        let dir = std::env::temp_dir().join(format!("ibjitter-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.dist");
        let e = read(&missing, Kind::Absolute).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(e.to_string().starts_with(&missing.display().to_string()));
        let bad = dir.join("bad.dist");
        std::fs::write(&bad, b"1 2\n3 \xff 4").unwrap();
        let e = read(&bad, Kind::Absolute).unwrap_err();
        assert_eq!((e.line, e.col), (2, 3), "{e}");
        let good = dir.join("good.dist");
        let t = ramp(Kind::Netem);
        t.write(std::fs::File::create(&good).unwrap()).unwrap();
        assert_eq!(read(&good, Kind::Netem).unwrap(), t);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_refuses_wrong_length() {
        let mut t = ramp(Kind::Absolute);
        t.entries.pop();
        assert!(t.to_text().is_err());
    }

    #[test]
    fn netem_delays() {
        let mut t = ramp(Kind::Netem);
        t.entries[0] = -8192;
        t.entries[1] = 8192;
        t.entries[2] = 4096;
        t.entries[3] = -32768;
        let d = t.netem_delays_ns(10_000.0, 2_000.0);
        assert_eq!(&d[..4], &[8_000, 12_000, 11_000, 2_000]);
        let d = t.netem_delays_ns(1_000.0, 2_000.0);
        assert_eq!(d[3], 0, "negative delays clamp to zero");
        assert_eq!(d.len(), ENTRIES);
    }

    #[test]
    fn reads_iproute2_files_when_present() {
        for name in ["normal", "pareto", "paretonormal", "experimental"] {
            if let Some(p) = iproute2_dist(name) {
                let t = read(&p, Kind::Netem).unwrap();
                assert_eq!(t.entries.len(), ENTRIES);
            }
        }
    }

    #[test]
    fn resolve_refuses_paths() {
        assert_eq!(resolve_named_dist("../etc/passwd"), None);
        assert_eq!(resolve_named_dist(""), None);
        assert_eq!(resolve_named_dist("no-such-table-xyz"), None);
    }
}

#[cfg(test)]
mod small_file_tests {
    use super::*;

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("ibjitter-small-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.txt");
        std::fs::write(&file, "12\n").unwrap();
        assert_eq!(read_small_file(&file, 3).unwrap(), b"12\n");
        let e = read_small_file(&file, 2).unwrap_err().to_string();
        assert!(e.contains("larger than 2 bytes"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, what) in [
            (Path::new("/dev/zero"), "a device"),
            (Path::new("/dev/urandom"), "a device"),
            (dir.as_path(), "a directory"),
            (fifo.as_path(), "a FIFO"),
        ] {
            let e = read_small_file(path, MAX_TABLE_BYTES)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{}: {e}", path.display());
        }
        let e = read(Path::new("/dev/zero"), Kind::Absolute)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero") && e.contains("a device"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

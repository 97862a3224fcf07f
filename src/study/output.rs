//! A run's output, read for its metric in bounded memory. The program writes straight into
//! its log file (nothing of it passes through the study); the metric is the last match, so
//! the file is read backwards, a block at a time, line by line, and reading stops at the
//! first line (from the end) that holds a number: a program printing hundreds of MB costs the
//! study a block and a line, and usually only the file's last blocks are read.
use regex::Regex;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes read per step backwards.
const BLOCK: usize = 64 << 10;
/// The longest line matched: of a longer one, only its last `MAX_LINE` bytes are (no metric
/// line is that long; the cap bounds memory on output without newlines).
pub const MAX_LINE: usize = 1 << 20;

/// The last match's first capture group (or the whole match) in one line, as a number.
fn last_in_line(re: &Regex, line: &str) -> Option<f64> {
    re.captures_iter(line)
        .filter_map(|c| {
            let m = c.get(1).or_else(|| c.get(0))?;
            m.as_str().trim().parse::<f64>().ok()
        })
        .last()
}

/// The last match's first capture group (or the whole match) as a number, matched line by
/// line; NaN if none.
pub fn last_match(re: &Regex, text: &str) -> f64 {
    text.lines()
        .rev()
        .find_map(|l| last_in_line(re, l))
        .unwrap_or(f64::NAN)
}

/// [`last_match`] over a file, read from its end; NaN if none or if it cannot be read.
pub fn last_match_in_file(re: &Regex, path: &Path) -> f64 {
    let Ok(mut file) = File::open(path) else {
        return f64::NAN;
    };
    let Ok(mut pos) = file.seek(SeekFrom::End(0)) else {
        return f64::NAN;
    };
    let check = |line: &[u8]| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match std::str::from_utf8(line) {
            Ok(text) => last_in_line(re, text),
            Err(_) => last_in_line(re, &String::from_utf8_lossy(line)),
        }
    };
    let filter = block_filter(re);
    // The line that goes on past the block read last (its last MAX_LINE bytes at most).
    let mut carry: Vec<u8> = Vec::new();
    let mut block = vec![0u8; BLOCK];
    while pos > 0 {
        let n = (pos as usize).min(BLOCK);
        pos -= n as u64;
        if file.seek(SeekFrom::Start(pos)).is_err() || file.read_exact(&mut block[..n]).is_err() {
            return f64::NAN;
        }
        let mut end = n;
        let mut filtered = false;
        while let Some(nl) = block[..end].iter().rposition(|&b| b == b'\n') {
            // With no line carried over, block[first + 1..end] is whole lines: one search
            // over them all skips them when none can match (a line at a time costs more).
            if carry.is_empty() && !filtered {
                filtered = true;
                let first = block[..end].iter().position(|&b| b == b'\n').unwrap_or(nl);
                if let (Some(f), Ok(text)) = (&filter, std::str::from_utf8(&block[first + 1..end]))
                {
                    if !f.is_match(text) {
                        end = first;
                        continue;
                    }
                }
            }
            let found = if carry.is_empty() {
                check(&block[nl + 1..end])
            } else {
                join_front(&mut carry, &block[nl + 1..end]);
                let v = check(&carry);
                carry.clear();
                v
            };
            if let Some(v) = found {
                return v;
            }
            end = nl;
        }
        join_front(&mut carry, &block[..end]);
    }
    check(&carry).unwrap_or(f64::NAN)
}

/// The pattern in multi-line mode (`^` and `$` at every line, CRLF too): it matches a run of
/// lines wherever the pattern matches one of them, so no match of it rules them all out.
/// `None` for patterns with absolute anchors (`\A`, `\z`), which it would not keep.
fn block_filter(re: &Regex) -> Option<Regex> {
    let p = re.as_str();
    if p.contains("\\A") || p.contains("\\z") {
        return None;
    }
    Regex::new(&format!("(?mR:{p})")).ok()
}

/// `front` put before `line`, keeping the line's last [`MAX_LINE`] bytes.
fn join_front(line: &mut Vec<u8>, front: &[u8]) {
    let room = MAX_LINE.saturating_sub(line.len());
    let front = &front[front.len().saturating_sub(room)..];
    line.splice(0..0, front.iter().copied());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_match_that_is_no_number_does_not_hide_an_earlier_one() {
        let any = Regex::new(r"time (\S+)").unwrap();
        assert_eq!(last_match(&any, "time 4\ntime x\n"), 4.0);
    }

    #[test]
    fn a_file_is_read_from_its_end_across_blocks() {
        let dir = std::env::temp_dir().join(format!("ibjitter-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("run.log");
        let re = Regex::new(r"Loop time ([0-9.]+)").unwrap();
        // The metric early, then more than a block of noise, then a line with no newline.
        let mut text = String::from("Loop time 7.5\r\n");
        text.push_str(&"noise noise noise\n".repeat(3 * BLOCK / 18));
        text.push_str("Loop time x");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(last_match_in_file(&re, &p), 7.5);
        assert_eq!(last_match_in_file(&re, &p), last_match(&re, &text));
        // A metric as the unterminated last line, and one split across a block boundary.
        std::fs::write(&p, format!("{text}\nLoop time 9")).unwrap();
        assert_eq!(last_match_in_file(&re, &p), 9.0);
        let pad = "y".repeat(BLOCK - 5);
        std::fs::write(&p, format!("Loop time 3.25\n{pad}\n")).unwrap();
        assert_eq!(last_match_in_file(&re, &p), 3.25);
        // A line longer than the cap is matched on its last MAX_LINE bytes.
        let long = format!("{}Loop time 6\n", "z".repeat(MAX_LINE + 10));
        std::fs::write(&p, &long).unwrap();
        assert_eq!(last_match_in_file(&re, &p), 6.0);
        assert!(last_match_in_file(&re, &dir.join("missing")).is_nan());
        // Anchored patterns match each line, as last_match does, through the block filter.
        let mut text = String::from("x\n5 ms\r\n");
        text.push_str(&"a 9 ms\n".repeat(3 * BLOCK / 7));
        std::fs::write(&p, &text).unwrap();
        for pattern in [r"^([0-9]+) ms$", r"\A([0-9]+) ms\z"] {
            let re = Regex::new(pattern).unwrap();
            assert_eq!(last_match_in_file(&re, &p), 5.0, "{pattern}");
            assert_eq!(last_match(&re, &text), 5.0, "{pattern}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

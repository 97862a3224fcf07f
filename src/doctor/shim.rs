//! The injector: it loads, and what its stats file (`IBJITTER_STATS`) says a program did:
//! posts per hook, delays injected, and why nothing was delayed if so.
use super::child::run_bounded;
use super::verdict::{Check, Verdict};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Stats files are small; a bigger one is not the injector's.
const MAX_STATS: u64 = 1 << 20;

/// The shim exists and the dynamic loader preloads it into a program.
pub fn check_loads(shim: &Path, dir: &Path) -> Check {
    let c = Check::new("shim", "libibjitter.so", Verdict::Ok);
    if !shim.is_file() {
        return c
            .verdict(Verdict::Fail)
            .detail(format!("no injector at {}", shim.display()))
            .advice("install it beside the binary (cargo build --release), or give --shim");
    }
    let run = run_bounded(
        Command::new("true")
            .env("LD_PRELOAD", shim)
            .env("IBJITTER_DELAY", "1us"),
        Duration::from_secs(20),
        Some(&dir.join("shim-loads.out")),
    );
    match run {
        Ok(f) if f.ok() && !f.output.contains("cannot be preloaded") => c.detail(format!(
            "{} preloads (the hooks each path went through: below)",
            shim.display()
        )),
        Ok(f) => c
            .verdict(Verdict::Fail)
            .detail(format!(
                "{} does not preload ({}): {}",
                shim.display(),
                f.how(),
                f.output.trim()
            ))
            .advice("is it built for this machine (same architecture, glibc)?"),
        Err(e) => c.verdict(Verdict::Fail).detail(e),
    }
}

/// What one process's stats file says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub post_send: u64,
    pub wr_complete: u64,
    pub ucp: u64,
    pub delays_injected: u64,
    pub sum_ns: u64,
    pub layer_used: String,
    pub nothing_delayed: Option<String>,
}

impl Stats {
    pub fn from_json(v: &Value) -> Stats {
        let n = |x: &Value| x.as_u64().unwrap_or(0);
        Stats {
            post_send: n(&v["posts"]["post_send"]),
            wr_complete: n(&v["posts"]["wr_complete"]),
            ucp: n(&v["posts"]["ucp"]),
            delays_injected: n(&v["delays_injected"]),
            sum_ns: n(&v["sum_ns"]),
            layer_used: v["layer_used"].as_str().unwrap_or_default().to_string(),
            nothing_delayed: v["nothing_delayed"].as_str().map(str::to_string),
        }
    }
    pub fn posts(&self) -> u64 {
        self.post_send + self.wr_complete + self.ucp
    }
    /// The hooks that saw posts, as "ibv_post_send 1000, ibv_wr_complete 0" text.
    pub fn hooks(&self) -> String {
        let mut h: Vec<String> = [
            ("ibv_post_send", self.post_send),
            ("ibv_wr_*", self.wr_complete),
            ("UCP", self.ucp),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
        if h.is_empty() {
            h.push("no hook saw a post".into());
        }
        h.join(", ")
    }
    /// Adds another process's counts (a program that forked).
    pub fn add(&mut self, o: &Stats) {
        self.post_send += o.post_send;
        self.wr_complete += o.wr_complete;
        self.ucp += o.ucp;
        self.delays_injected += o.delays_injected;
        self.sum_ns += o.sum_ns;
        if self.layer_used.is_empty() {
            self.layer_used = o.layer_used.clone();
        }
        if self.nothing_delayed.is_none() {
            self.nothing_delayed = o.nothing_delayed.clone();
        }
    }
}

/// The stats of every process whose file is `dir/PREFIX.*.json`, added up (None: no file:
/// the injector was not loaded, or the program never opened a device).
pub fn read_stats(dir: &Path, prefix: &str) -> Result<Option<Stats>, String> {
    let mut total: Option<Stats> = None;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(&format!("{prefix}.")) && name.ends_with(".json")) {
            continue;
        }
        let p = e.path();
        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
        if len > MAX_STATS {
            return Err(format!(
                "{}: {len} bytes, more than a stats file ({MAX_STATS})",
                p.display()
            ));
        }
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        total
            .get_or_insert_with(Stats::default)
            .add(&Stats::from_json(&v));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_say_which_hooks_saw_posts() {
        let v: Value = serde_json::from_str(
            r#"{"layer_used":"verbs","posts":{"post_send":0,"wr_complete":200,"ucp":0},
                "posts_total":200,"delays_injected":200,"sum_ns":20000000,"nothing_delayed":null}"#,
        )
        .unwrap();
        let s = Stats::from_json(&v);
        assert_eq!(
            (s.wr_complete, s.posts(), s.delays_injected),
            (200, 200, 200)
        );
        assert_eq!(s.hooks(), "ibv_wr_* 200");
        assert_eq!(s.nothing_delayed, None);
        let none = Stats::from_json(
            &serde_json::from_str(r#"{"nothing_delayed":"the program uses UCX"}"#).unwrap(),
        );
        assert_eq!(none.hooks(), "no hook saw a post");
        assert_eq!(
            none.nothing_delayed.as_deref(),
            Some("the program uses UCX")
        );
    }

    #[test]
    fn stats_files_of_one_prefix_add_up_and_others_are_left_out() {
        let dir =
            std::env::temp_dir().join(format!("ibjitter-doctor-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let one =
            r#"{"posts":{"post_send":3,"wr_complete":0,"ucp":0},"delays_injected":3,"sum_ns":30}"#;
        std::fs::write(dir.join("a.1.json"), one).unwrap();
        std::fs::write(dir.join("a.2.json"), one).unwrap();
        std::fs::write(dir.join("ab.3.json"), one).unwrap();
        let s = read_stats(&dir, "a").unwrap().unwrap();
        assert_eq!((s.post_send, s.delays_injected, s.sum_ns), (6, 6, 60));
        assert_eq!(read_stats(&dir, "zz").unwrap(), None);
        std::fs::write(dir.join("bad.1.json"), "{").unwrap();
        let e = read_stats(&dir, "bad").unwrap_err();
        assert!(e.contains("bad.1.json"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

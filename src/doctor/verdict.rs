//! What every check decides: its [`Verdict`] and the report's line for it ([`Check`]). Below
//! the groups of checks, which all make them, and the report, which gathers them.
use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// Works, but something deserves a look (or a path could not be tried).
    Warn,
    /// Injection on this machine cannot be trusted until this is fixed.
    Fail,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Which group of checks (device, clock, software, shim, path).
    pub group: &'static str,
    pub name: String,
    pub verdict: Verdict,
    /// What was found, and why the verdict.
    pub detail: String,
    /// What to do about it (empty when nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub advice: String,
    /// The figures behind the verdict, for the JSON.
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl Check {
    pub fn new(group: &'static str, name: impl Into<String>, verdict: Verdict) -> Check {
        Check {
            group,
            name: name.into(),
            verdict,
            detail: String::new(),
            advice: String::new(),
            data: serde_json::Value::Null,
        }
    }
    pub fn verdict(mut self, v: Verdict) -> Check {
        self.verdict = v;
        self
    }
    pub fn detail(mut self, d: impl Into<String>) -> Check {
        self.detail = d.into();
        self
    }
    pub fn advice(mut self, a: impl Into<String>) -> Check {
        self.advice = a.into();
        self
    }
    pub fn data(mut self, d: serde_json::Value) -> Check {
        self.data = d;
        self
    }
    /// The report's line: verdict, group, name, detail; advice on its own line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:<4}  {:<8}  {}: {}",
            self.verdict.label(),
            self.group,
            self.name,
            self.detail
        );
        if !self.advice.is_empty() {
            s += &format!("\n                -> {}", self.advice);
        }
        s
    }
}

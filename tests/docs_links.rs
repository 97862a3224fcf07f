//! Every relative link in README.md and docs/*.md points at a file that exists and, with a
//! `#fragment`, at a heading of that file (GitHub's anchor for it).
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown pages checked: the README and every page under docs/ (not docs/reproduce's
/// generated summary, which has no relative links of ours to keep).
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for entry in fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(path: &Path) -> HashSet<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    prose(&text)
        .into_iter()
        .filter(|(_, l)| l.starts_with('#'))
        .map(|(_, l)| slug(l.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` and `![alt](target)` on a line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                out.push(&after[..j]);
                rest = &after[j + 1..];
            }
            None => break,
        }
    }
    out
}

#[test]
fn relative_links_in_the_readme_and_docs_resolve() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, fragment) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target, None),
                };
                let file = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                let at = format!("{}:{n}: {target}", page.display());
                if !file.exists() {
                    bad.push(format!("{at}: no such file"));
                } else if let Some(a) = fragment {
                    if !anchors(&file).contains(a) {
                        bad.push(format!("{at}: no heading with anchor #{a}"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser broken?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Checking a machine: `ibjitter doctor`"),
        "checking-a-machine-ibjitter-doctor"
    );
    assert_eq!(slug("The injector's hot path"), "the-injectors-hot-path");
}

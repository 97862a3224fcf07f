//! The house's structure, checked: no import circle between the modules of either crate
//! (`src/` and the injector, `shim/src/`), and the injector's modules import only from the
//! layers its crate doc lists before their own (`shim/src/lib.rs`, the "Layers" list).
//!
//! A module's imports are the `crate::…`, `super::…` and `self::…` paths in its code, and the
//! bare paths that start with one of its own submodules (`use ops::Op` in a parent), comments
//! and `#[cfg(test)]` items aside, each resolved to the deepest module file it names.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path ("" for the crate root, "draw::counts") → its file's code.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                out.insert(
                    parts.join("::"),
                    code_of(&std::fs::read_to_string(&p).unwrap()),
                );
            }
        }
    }
    out
}

/// The code of a file without comments and without its `#[cfg(test)]` items (test code may
/// reach anywhere in its crate).
fn code_of(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        // The item ends at its `;` or at the brace closing its first `{`.
        let b = rest.as_bytes();
        let (mut depth, mut end) = (0usize, b.len());
        for (k, &c) in b.iter().enumerate() {
            match c {
                b';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Every path a `use` or an expression names from `crate::`, `super::`, `self::` or one of
/// the module's own submodules (`children`: a parent that uses its child by a bare path),
/// expanded (`crate::{a, b::{c, d}}` → `a`, `b::c`, `b::d`), relative to the crate root.
fn imported_paths(module: &str, code: &str, children: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let own = |child: &str| {
        if module.is_empty() {
            child.to_string()
        } else {
            format!("{module}::{child}")
        }
    };
    for child in children {
        let start = format!("{child}::");
        let mut from = 0;
        while let Some(i) = code[from..].find(&start) {
            let at = from + i;
            from = at + start.len();
            // Not the tail of another identifier or path (`serde_json::`, `crate::json::`).
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || b"_:".contains(&bytes[at - 1])) {
                continue;
            }
            expand(&code[from..], &own(child), &mut out);
        }
    }
    for (start, prefix) in [("crate::", ""), ("super::", "super"), ("self::", "self")] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            // A path starts here unless it is the tail of another identifier (`foo_crate::`)
            // or path (`super::self::` does not occur; `x::self` is handled by `expand`).
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || b"_:".contains(&bytes[at - 1])) {
                continue;
            }
            let base = match prefix {
                "super" => {
                    let mut parts: Vec<&str> = module.split("::").collect();
                    parts.pop();
                    parts.join("::")
                }
                "self" => module.to_string(),
                _ => String::new(),
            };
            expand(&code[from..], &base, &mut out);
        }
    }
    out
}

/// Expands the path tree at the start of `rest` under `base` into `out`.
fn expand(rest: &str, base: &str, out: &mut Vec<String>) -> usize {
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}::{b}")
        }
    };
    let rest_trim = rest.trim_start();
    let skipped = rest.len() - rest_trim.len();
    if let Some(inner) = rest_trim.strip_prefix('{') {
        let mut i = 0;
        let b = inner.as_bytes();
        loop {
            while i < b.len() && (b[i] == b',' || b[i].is_ascii_whitespace()) {
                i += 1;
            }
            if i >= b.len() || b[i] == b'}' {
                return skipped + 1 + i + 1;
            }
            i += expand(&inner[i..], base, out);
        }
    }
    let ident: String = rest_trim
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let after = &rest_trim[ident.len()..];
    if ident.is_empty() {
        return skipped + 1;
    }
    if ident == "self" {
        out.push(base.to_string());
        return skipped + 4;
    }
    let path = if ident == "super" {
        base.rsplit_once("::")
            .map_or(String::new(), |(p, _)| p.to_string())
    } else {
        join(base, &ident)
    };
    if let Some(tail) = after.strip_prefix("::") {
        skipped + ident.len() + 2 + expand(tail, &path, out)
    } else {
        out.push(path);
        skipped + ident.len()
    }
}

/// The deepest module of `mods` that `path` names (None: the crate root, or an item of it).
fn resolve<'a>(mods: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find_map(|p| mods.get_key_value(&p).map(|(k, _)| k.as_str()))
        .filter(|k| !k.is_empty())
}

/// Module → the modules it imports (not itself, not its own submodules' parents chain).
fn graph(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    mods.iter()
        .map(|(m, code)| {
            let prefix = if m.is_empty() {
                String::new()
            } else {
                format!("{m}::")
            };
            let children: Vec<&str> = mods
                .keys()
                .filter_map(|k| k.strip_prefix(prefix.as_str()))
                .filter(|rest| !rest.is_empty() && !rest.contains("::"))
                .collect();
            let deps = imported_paths(m, code, &children)
                .iter()
                .filter_map(|p| resolve(mods, p))
                .filter(|d| d != m)
                .map(str::to_string)
                .collect();
            (m.clone(), deps)
        })
        .collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.g.contains_key(w) {
                continue;
            }
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn assert_no_circle(src: &Path) {
    let g = graph(&modules(src));
    let found = circles(&g);
    assert!(
        found.is_empty(),
        "{}: modules that import each other, directly or around a circle: {found:?}",
        src.display()
    );
}

#[test]
fn the_toolkit_has_no_import_circle() {
    assert_no_circle(&root().join("src"));
}

#[test]
fn the_injector_has_no_import_circle() {
    assert_no_circle(&root().join("shim/src"));
}

/// The layers of the injector's crate doc, bottom first: "//! - [`name`]: …" lines.
fn declared_layers(lib: &str) -> Vec<String> {
    let start = lib
        .find("//! Layers, from the bottom up")
        .expect("shim/src/lib.rs says its layers");
    lib[start..]
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_injectors_layers_import_only_from_below() {
    let src = root().join("shim/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let layers = declared_layers(&lib);
    let mods = modules(&src);
    let top: BTreeSet<&str> = mods
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m.split("::").next().unwrap())
        .collect();
    let listed: BTreeSet<&str> = layers.iter().map(String::as_str).collect();
    assert_eq!(
        top, listed,
        "the crate doc's layers are the top-level modules"
    );
    let layer_of = |m: &str| {
        let t = m.split("::").next().unwrap();
        layers.iter().position(|l| l == t).unwrap()
    };
    let mut upward = Vec::new();
    for (m, deps) in graph(&mods) {
        if m.is_empty() {
            continue;
        }
        for d in deps {
            if layer_of(&d) > layer_of(&m) {
                upward.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a higher layer (shim/src/lib.rs lists the order): {upward:#?}"
    );
}

#[test]
fn the_checker_sees_circles_and_nested_imports() {
    let mut mods = BTreeMap::new();
    mods.insert(String::new(), String::new());
    mods.insert("a".into(), "use crate::{b::{x, y}, c};\n".into());
    mods.insert("b".into(), "fn f() { crate::a::g() } // crate::c\n".into());
    mods.insert("c".into(), "use super::d; // comment\n".into());
    mods.insert(
        "d".into(),
        "#[cfg(test)]\nuse crate::a;\n#[cfg(test)]\nmod t { fn f() { crate::b::x() } }\nfn g() {}\n"
            .into(),
    );
    mods.insert("e::f".into(), "use super::super::c;\n".into());
    // A parent and its child by bare and `self::` paths, beside look-alikes that are not.
    mods.insert(
        "p".into(),
        "mod q;\nuse q::x;\nfn f() { serde_q::y(); crate::c::z(); }\n".into(),
    );
    mods.insert("p::q".into(), "use super::w;\n".into());
    mods.insert("r".into(), "mod s;\nfn f() { self::s::t() }\n".into());
    mods.insert("r::s".into(), String::new());
    let mods: BTreeMap<String, String> = mods.into_iter().map(|(k, v)| (k, code_of(&v))).collect();
    let g = graph(&mods);
    assert_eq!(g["a"], BTreeSet::from(["b".to_string(), "c".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["a".to_string()]));
    assert_eq!(g["c"], BTreeSet::from(["d".to_string()]));
    assert!(g["d"].is_empty());
    assert_eq!(g["e::f"], BTreeSet::from(["c".to_string()]));
    assert_eq!(
        g["p"],
        BTreeSet::from(["p::q".to_string(), "c".to_string()])
    );
    assert_eq!(g["p::q"], BTreeSet::from(["p".to_string()]));
    assert_eq!(g["r"], BTreeSet::from(["r::s".to_string()]));
    assert_eq!(
        circles(&g),
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["p".to_string(), "p::q".to_string()]
        ]
    );
}

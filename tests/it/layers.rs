//! The layers of `src/` point one way: every file names (`crate::module::...`)
//! only modules of a lower rank than its own. The ranks and the imports still
//! allowed against them are read from docs/design/architecture.md ("Layers"),
//! so the doc and the check cannot drift apart.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ARCHITECTURE: &str = "docs/design/architecture.md";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `| 3 | `mock` | ... |` rows: module to rank.
fn ranks(doc: &str) -> BTreeMap<String, u32> {
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let rank = cells.get(1)?.parse().ok()?;
            let module = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((module.to_string(), rank))
        })
        .collect()
}

/// `| `a` | `b` | why |` rows under "Imports against the rule".
fn exceptions(doc: &str) -> BTreeSet<(String, String)> {
    let Some((_, section)) = doc.split_once("### Imports against the rule") else {
        panic!("{ARCHITECTURE} has no \"Imports against the rule\" section");
    };
    let section = section.split("\n#").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let from = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let to = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((from.to_string(), to.to_string()))
        })
        .collect()
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's text without its unit tests (from the first `#[cfg(test)]` module
/// on) and without comments.
fn production_code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
    (text.lines())
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::`, including inside
/// `use crate::{a::X, b}` groups.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend(leading_ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            found.extend(leading_ident(&item));
        } else {
            found.extend(leading_ident(rest));
        }
    }
    found
}

fn leading_ident(text: &str) -> Option<String> {
    let ident: String = (text.trim_start().chars())
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!ident.is_empty() && ident != "self").then_some(ident)
}

#[test]
fn every_import_points_down_the_layers() {
    let doc = std::fs::read_to_string(root().join(ARCHITECTURE)).unwrap();
    let ranks = ranks(&doc);
    let allowed = exceptions(&doc);
    assert!(
        ranks.len() > 10,
        "{ARCHITECTURE}: the rank table was not read"
    );
    let src = root().join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut against = Vec::new();
    let mut seen_exceptions = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
        // The crate root and the binary; a unit-test module of its own file.
        if module == "lib" || module == "main" || file.ends_with("tests.rs") {
            continue;
        }
        let Some(&rank) = ranks.get(&module) else {
            panic!("src/{module} has no rank in {ARCHITECTURE}'s layer table: add it");
        };
        let code = production_code(&std::fs::read_to_string(file).unwrap());
        for named in named_modules(&code) {
            if named == module {
                continue;
            }
            let Some(&named_rank) = ranks.get(&named) else {
                panic!(
                    "{}: names crate::{named}, which has no rank",
                    relative.display()
                );
            };
            if named_rank < rank {
                continue;
            }
            let edge = (module.clone(), named.clone());
            if allowed.contains(&edge) {
                seen_exceptions.insert(edge);
            } else {
                against.push(format!(
                    "src/{}: {module} (rank {rank}) names crate::{named} (rank {named_rank})",
                    relative.display()
                ));
            }
        }
    }
    assert!(
        against.is_empty(),
        "imports against the layers ({ARCHITECTURE}):\n{}",
        against.join("\n")
    );
    let stale: Vec<_> = allowed.difference(&seen_exceptions).collect();
    assert!(
        stale.is_empty(),
        "{ARCHITECTURE} lists imports against the rule that no longer occur: {stale:?}"
    );
}

#[test]
fn the_import_reader_finds_grouped_and_nested_paths() {
    let code = "use crate::{actor::{Binding, Registry}, config, self};\n\
                let x = crate::proxy::state::AppState::new();\n\
                use crate::tokens;";
    let found: Vec<_> = named_modules(code).into_iter().collect();
    assert_eq!(found, ["actor", "config", "proxy", "tokens"]);
    let code = "fn f() {}\n#[cfg(test)]\nmod tests { use crate::server; }";
    assert!(named_modules(&production_code(code)).is_empty());
    let code = "// crate::server in a comment\nuse crate::clock; // crate::proxy";
    assert_eq!(named_modules(&production_code(code)).len(), 1);
}

#[test]
fn the_doc_tables_are_read() {
    let doc = "| rank | module | role |\n|---|---|---|\n| 0 | `config` | leaf |\n\
               | 7 | `sync` | sync |\n\n### Imports against the rule\n\n\
               | from | to | why |\n|---|---|---|\n| `sync` | `proxy` | handles |\n\n## Next\n\
               | `a` | `b` | not read |";
    assert_eq!(ranks(doc).get("sync"), Some(&7));
    assert_eq!(ranks(doc).len(), 2);
    let allowed = exceptions(doc);
    assert_eq!(allowed.len(), 1);
    assert!(allowed.contains(&("sync".to_string(), "proxy".to_string())));
}

//! The repository speaks of the product only: what is true now, never how or
//! when it was built. History lives in git. This check reads every source,
//! script, config and doc file and fails on the words that narrate the work:
//! a numbered or ordinal work session, an issue number, a review that found
//! something, or a file outside the repository (the team's workspace or its
//! brief).

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

/// Folders that are not the product's text.
const SKIPPED_DIRS: &[&str] = &["target", ".git", "proptest-regressions", "node_modules"];
/// File endings that hold text a reader reads.
const READ_ENDINGS: &[&str] = &[
    "rs", "md", "toml", "sh", "lua", "yml", "yaml", "py", "txt", "json",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_str()) {
                text_files(&path, out);
            }
        } else if name != "Cargo.lock"
            && (path.extension()).is_some_and(|e| READ_ENDINGS.iter().any(|r| e == *r))
        {
            out.push(path);
        }
    }
}

/// Words of `line`, lowercased: letters, digits, `#` and `-`.
fn words(line: &str) -> Vec<String> {
    line.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '#' || c == '-'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// "first", "thirty-seventh", "37th", "this", "last", ...: words that make a
/// following "session" a work session.
fn is_ordinal(word: &str) -> bool {
    const NAMED: &[&str] = &[
        "first", "second", "third", "this", "last", "next", "previous",
    ];
    let last = word.rsplit('-').next().unwrap_or(word);
    NAMED.contains(&last)
        || (last.ends_with("th") && last.len() > 3 && last != "both" && last != "month")
        || ["1st", "2nd", "3rd"].iter().any(|s| last.ends_with(s))
}

/// Why `line` narrates the work, if it does.
fn narration(line: &str) -> Option<&'static str> {
    let words = words(line);
    for pair in words.windows(2) {
        let (a, b) = (pair[0].as_str(), pair[1].as_str());
        if (b == "session" || b == "sessions") && is_ordinal(a) {
            return Some("names a work session");
        }
        let number = b.trim_start_matches('#');
        if a == "issue" && !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
            return Some("names an issue number");
        }
    }
    let lower = line.to_lowercase();
    if lower.contains("a review found") || lower.contains("found by a review") {
        return Some("tells of a review");
    }
    if lower.contains(concat!("../", "shared")) {
        return Some("points outside the repository");
    }
    let brief = concat!("design", ".md");
    let mut from = 0;
    while let Some(at) = lower[from..].find(brief) {
        let at = from + at;
        let before = lower[..at].chars().next_back();
        if !before.is_some_and(|c| c == '/' || c == '.' || c == '-' || c.is_alphanumeric()) {
            return Some("cites a brief outside the repository");
        }
        from = at + brief.len();
    }
    None
}

#[test]
fn the_repository_speaks_of_the_product_only() {
    let root = root();
    let mut files = Vec::new();
    text_files(&root, &mut files);
    assert!(files.len() > 100, "read only {} files", files.len());
    let mut found = Vec::new();
    // This file's own examples are the narration it looks for.
    let own = root.join(file!());
    for file in files.iter().filter(|f| **f != own) {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = narration(line) {
                let path = file.strip_prefix(&root).unwrap().display();
                found.push(format!("{path}:{}: {why}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "say what is true now, not how it was built (history lives in git):\n{}",
        found.join("\n")
    );
}

#[test]
fn narration_is_told_from_the_product() {
    // Spelled in pieces so that no line of this file reads as narration itself.
    let work = [
        concat!("measured in the thirty-seventh", " session"),
        concat!("see the 12th", " session's table"),
        concat!("since this", " session the memo is on"),
        concat!("fixed for issue", " 6"),
        concat!("closes issue", " #41"),
        "a review found the keepalive missing",
        concat!("read ../", "shared/style.md"),
        concat!("(", "design", ".md section 5)"),
    ];
    for line in work {
        assert!(narration(line).is_some(), "not caught: {line}");
    }
    let product = [
        "a session of the load generator ends after --duration",
        concat!("both", " sessions of a month"),
        "docs/design/lease.md, section 2",
        "an issue with the upstream's body",
        "see docs/design/architecture.md",
    ];
    for line in product {
        assert_eq!(narration(line), None, "caught: {line}");
    }
}

use super::*;
use proptest::prelude::*;
use std::sync::LazyLock;

static O200K: LazyLock<BpeCounter> = LazyLock::new(BpeCounter::o200k_base);
static CL100K: LazyLock<BpeCounter> = LazyLock::new(BpeCounter::cl100k_base);

fn both() -> [(&'static BpeCounter, &'static CoreBPE); 2] {
    [
        (&O200K, tiktoken_rs::o200k_base_singleton()),
        (&CL100K, tiktoken_rs::cl100k_base_singleton()),
    ]
}

/// cl100k_base's pattern as tiktoken-rs 0.12 compiles it (its
/// `cl100k_base()`; o200k_base's is public).
const CL100K_TIKTOKEN_RS: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";

static REFERENCE_PIECES: LazyLock<[fancy_regex::Regex; 2]> = LazyLock::new(|| {
    [tiktoken_rs::O200K_BASE_PAT_STR, CL100K_TIKTOKEN_RS]
        .map(|pattern| fancy_regex::Regex::new(pattern).expect("compiles"))
});

/// Both encodings split `text` into the pieces tiktoken-rs's patterns
/// make, and count what tiktoken-rs counts.
fn assert_counts_match(text: &str) {
    for ((ours, reference), pieces) in both().into_iter().zip(&*REFERENCE_PIECES) {
        let expected: Vec<&str> = pieces
            .find_iter(text)
            .map(|piece| piece.expect("no backtracking limit").as_str())
            .collect();
        assert_eq!(ours.pieces(text).collect::<Vec<_>>(), expected, "{text:?}");
        assert_eq!(ours.count(text), reference.count_ordinary(text), "{text:?}");
    }
}

/// Characters chosen to reach every branch of both patterns and the
/// edges of their classes: letters of each case class, marks, digits of
/// other scripts, every kind of space and line break, the apostrophe
/// suffixes with the characters Unicode folds into `s` and `k`, `/`,
/// punctuation, CJK and emoji.
const ALPHABET: &[&str] = &[
    "a",
    "Z",
    "é",
    "ǅ",
    "ʰ",
    "中",
    "\u{301}",
    "\u{903}",
    "1",
    "٣",
    "Ⅻ",
    "½",
    " ",
    "  ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\u{b}",
    "\u{c}",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "'",
    "'s",
    "'S",
    "'ll",
    "'VE",
    "'re",
    "'m",
    "'d",
    "'t",
    "ſ",
    "K",
    "/",
    ".",
    "!?",
    "-",
    "_",
    "\"",
    "😀",
    "👍🏽",
    "\u{200d}",
    "\u{feff}",
    "<|endoftext|>",
    "\u{2029}",
    "\u{1680}",
    "\u{2009}",
    "\u{202f}",
    "\u{180e}",
    "\u{200b}",
    "É",
    "\u{20dd}",
    "'LL",
    "'Re",
    "'D",
    "'M",
    "'T",
];

fn text_from(alphabet: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(alphabet), 0..40).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn counts_equal_tiktoken_rs_on_texts_reaching_every_branch(text in text_from(ALPHABET)) {
        assert_counts_match(&text);
    }

    #[test]
    fn counts_equal_tiktoken_rs_on_arbitrary_text(text in any::<String>()) {
        assert_counts_match(&text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Longer texts, so that runs of mixed spaces and long pieces occur.
    #[test]
    fn counts_equal_tiktoken_rs_on_long_texts_reaching_every_branch(
        parts in prop::collection::vec(prop::sample::select(ALPHABET), 0..400),
    ) {
        assert_counts_match(&parts.concat());
    }

    /// The heap merge of long pieces against tiktoken's own merge, on bytes
    /// of small alphabets (many merges), any bytes (few), and bytes that
    /// are not UTF-8.
    #[test]
    fn the_heap_merge_counts_what_tiktokens_merge_counts(
        alphabet in prop::sample::select(vec![&b"ab"[..], b"ab \n", b"etaoin shrdlu", b"0123456789", b"!-/=*"]),
        picks in prop::collection::vec(any::<prop::sample::Index>(), LONG_PIECE_BYTES..400),
        any_bytes in prop::collection::vec(any::<u8>(), LONG_PIECE_BYTES..400),
    ) {
        let chosen: Vec<u8> = picks.iter().map(|i| alphabet[i.index(alphabet.len())]).collect();
        for piece in [&chosen, &any_bytes] {
            for ours in [&*O200K, &*CL100K] {
                let reference = tiktoken_rs::byte_pair_split(piece, &ours.ranks).len();
                prop_assert_eq!(count_long_piece(piece, &ours.ranks), reference);
            }
        }
    }
}

#[test]
fn counts_equal_tiktoken_rs_on_prose_code_and_long_pieces() {
    let prose = "You are a helpful assistant. Summarise the report below in three \
                 bullet points;  don't   invent figures.\n\n  - Revenue: $1,234,567 (+12.5%)\n\tQ3's \
                 outlook: 'cautious'.\r\n";
    let code = "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");  // done\n}\n";
    assert_counts_match(prose);
    assert_counts_match(code);
    for edge in [
        "a\u{3000}\u{3000}b",
        "x \u{85}y",
        "don'ſ",
        "DON'T",
        "1234567",
        "  \n  x",
        "\r\n\r\n  ",
        "x  ",
        "//\n",
        " !!\r\n\r\n/",
        "a\u{2028}\u{2028}b",
    ] {
        assert_counts_match(edge);
    }
    for long in [
        " ".repeat(5_000),
        " ".repeat(5_000) + "x",
        "\n".repeat(300),
        "=".repeat(4_000),
        "-_".repeat(1_000),
        "a".repeat(3_000),
        "Supercalifragilistic".repeat(40),
        "中文".repeat(500),
        "😀".repeat(400),
        "\u{301}".repeat(300),
        "1234567890".repeat(50),
        "\u{3000}".repeat(60) + "x",
        "\t".repeat(150) + "x",
        " ".repeat(150) + "\u{85}x",
        " \n".repeat(100) + "x",
        "abcdefghijklmnopqrstuvwxyz".repeat(8),
        "A".to_owned() + &"bcdefghij".repeat(17),
        "!\"#$%&'()*+,-./".repeat(15),
        "漢字仮名交じり文".repeat(20),
    ] {
        assert_counts_match(&long);
    }
}

#[test]
fn the_vocabularies_hold_every_ordinary_token_and_no_special_one() {
    assert_eq!(O200K.ranks.len(), 199_998);
    assert_eq!(CL100K.ranks.len(), 100_256);
    assert!(!O200K.ranks.contains_key(b"<|endoftext|>".as_slice()));
    assert!(!CL100K.ranks.contains_key(b"<|endoftext|>".as_slice()));
}

#[test]
fn a_run_of_spaces_before_a_word_leaves_its_last_space_to_the_word() {
    assert_eq!(leave_last_space("a   b", 1, 4), 3);
    assert_eq!(leave_last_space("a \tb", 1, 3), 2);
    assert_eq!(leave_last_space("a b", 1, 2), 2, "a single space stays");
    assert_eq!(
        leave_last_space("a   ", 1, 4),
        4,
        "at the end nothing follows"
    );
    assert_eq!(
        leave_last_space("a \n b", 1, 3),
        3,
        "a line break ends a piece"
    );
    assert_eq!(leave_last_space("a \u{3000}b", 1, 5), 2, "a wide space");
    assert_eq!(leave_last_space("a.b", 1, 2), 2, "not a space");
}

//! The static tier's tokenizer from its files: `charmap.tsv` (the BERT normalizer and
//! pre-tokenizer as a per-codepoint table) and `vocab.txt` (WordPiece), with the
//! numbers of `static_config.json`. docs/specs/router-scorer.md, "Tokenizer", gives the rules;
//! `replaylab.runtime.static_encoder.CharmapTokenizer` is the Python implementation.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::util::error::Error;

pub const CHARMAP_HEADER: &str = "# replaylab charmap 1";
const N_CODEPOINTS: usize = 0x11_0000;
const SAME: u32 = u32::MAX;

/// Class of a normalized character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Class {
    /// other: part of the current word
    Other = 0,
    /// whitespace: ends the current word
    Space = 1,
    /// punctuation: ends the current word and is a word of its own
    Punct = 2,
}

/// FNV-1a: a fast std-only hasher for the vocabulary (short keys, no adversary).
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf29ce484222325 } else { self.0 };
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        self.0 = h;
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// `charmap.tsv` as dense tables over every codepoint.
pub struct Charmap {
    /// per codepoint: SAME (maps to itself) or an offset into `pool`
    repl_at: Vec<u32>,
    repl_len: Vec<u8>,
    pool: Vec<char>,
    class: Vec<u8>,
}

impl Charmap {
    pub fn parse(text: &str) -> Result<Charmap, Error> {
        let bad = |m: String| Error::new("charmap", m);
        let mut lines = text.split('\n');
        if lines.next() != Some(CHARMAP_HEADER) {
            return Err(bad(format!("charmap.tsv must start with {CHARMAP_HEADER:?}")));
        }
        let mut cm = Charmap {
            repl_at: vec![SAME; N_CODEPOINTS],
            repl_len: vec![0; N_CODEPOINTS],
            pool: Vec::new(),
            class: vec![Class::Other as u8; N_CODEPOINTS],
        };
        for (k, line) in lines.enumerate() {
            if line.is_empty() {
                continue;
            }
            let row = || bad(format!("charmap.tsv line {}: {:?}", k + 2, &line[..line.len().min(60)]));
            let mut f = line.split('\t');
            let (Some(cp), Some(cls), Some(repl), None) = (f.next(), f.next(), f.next(), f.next()) else {
                return Err(row());
            };
            let cp = parse_cp(cp).ok_or_else(row)?;
            let out: Option<Vec<char>> = repl.split_ascii_whitespace().map(parse_cp).collect();
            let out = out.ok_or_else(row)?;
            cm.class[cp as usize] = match cls {
                "w" => Class::Space as u8,
                "p" => Class::Punct as u8,
                "o" => Class::Other as u8,
                _ => return Err(bad(format!("charmap.tsv line {}: class {cls:?}", k + 2))),
            };
            if out.len() > u8::MAX as usize {
                return Err(row());
            }
            if out.len() != 1 || out[0] != cp {
                cm.repl_at[cp as usize] = cm.pool.len() as u32;
                cm.repl_len[cp as usize] = out.len() as u8;
                cm.pool.extend_from_slice(&out);
            }
        }
        Ok(cm)
    }

    /// Push the normalization of `c` (itself, its replacement, or nothing) through `f`.
    #[inline]
    pub fn normalize(&self, c: char, mut f: impl FnMut(char)) {
        let at = self.repl_at[c as usize];
        if at == SAME {
            f(c);
        } else {
            for &o in &self.pool[at as usize..at as usize + self.repl_len[c as usize] as usize] {
                f(o);
            }
        }
    }

    #[inline]
    pub fn class(&self, c: char) -> Class {
        match self.class[c as usize] {
            1 => Class::Space,
            2 => Class::Punct,
            _ => Class::Other,
        }
    }
}

fn parse_cp(h: &str) -> Option<char> {
    if h.is_empty() || h.len() > 6 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    char::from_u32(u32::from_str_radix(h, 16).ok()?) // surrogates are not chars: refused
}

/// `vocab.txt`: one token per LF-terminated line; line i is id i. A token listed twice
/// maps to its last line (as Python's `{tok: i for i, tok in enumerate(vocab)}`).
pub fn parse_vocab(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text.split('\n').collect();
    if v.last() == Some(&"") {
        v.pop();
    }
    v
}

pub struct Tokenizer {
    pub charmap: Charmap,
    pub vocab: FastMap<String, u32>,
    pub unk_id: u32,
    pub prefix: String,
    pub max_word: usize,
    pub max_chars: usize,
    pub max_tokens: usize,
    pub drop_unk: bool,
}

impl Tokenizer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(charmap: Charmap, vocab: &[&str], unk_token: &str, prefix: &str, max_word: usize,
               max_chars: usize, max_tokens: usize, drop_unk: bool) -> Result<Tokenizer, Error> {
        let mut map = FastMap::default();
        map.reserve(vocab.len());
        for (i, t) in vocab.iter().enumerate() {
            map.insert(t.to_string(), i as u32);
        }
        let unk_id = *map
            .get(unk_token)
            .ok_or_else(|| Error::new("vocab", format!("unk token {unk_token:?} not in vocab.txt")))?;
        Ok(Tokenizer { charmap, vocab: map, unk_id, prefix: prefix.to_string(), max_word, max_chars,
                       max_tokens, drop_unk })
    }

    /// Token ids of one text: the first `max_chars` codepoints, normalized and split into
    /// words by the charmap, WordPiece per word, the first `max_tokens` ids, then every
    /// unk id dropped when `drop_unk`.
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut ids: Vec<u32> = Vec::with_capacity(64);
        let mut word = String::with_capacity(64);
        let mut scratch = Scratch::default();
        let cm = &self.charmap;
        for c in text.chars().take(self.max_chars) {
            if ids.len() >= self.max_tokens {
                break; // later words cannot survive the truncation
            }
            cm.normalize(c, |o| match cm.class(o) {
                Class::Other => word.push(o),
                Class::Space => self.flush(&mut word, &mut ids, &mut scratch),
                Class::Punct => {
                    self.flush(&mut word, &mut ids, &mut scratch);
                    word.push(o);
                    self.flush(&mut word, &mut ids, &mut scratch);
                }
            });
        }
        self.flush(&mut word, &mut ids, &mut scratch);
        ids.truncate(self.max_tokens);
        if self.drop_unk {
            ids.retain(|&i| i != self.unk_id);
        }
        ids
    }

    fn flush(&self, word: &mut String, ids: &mut Vec<u32>, s: &mut Scratch) {
        if !word.is_empty() {
            self.wordpiece(word, ids, s);
            word.clear();
        }
    }

    /// Greedy longest-prefix WordPiece of one word; no match at some position, or more
    /// than `max_word` codepoints: the whole word is one unk id.
    pub fn wordpiece_ids(&self, word: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        self.wordpiece(word, &mut ids, &mut Scratch::default());
        ids
    }

    fn wordpiece(&self, word: &str, ids: &mut Vec<u32>, s: &mut Scratch) {
        s.bounds.clear();
        s.bounds.extend(word.char_indices().map(|(i, _)| i));
        let n = s.bounds.len();
        s.bounds.push(word.len());
        if n > self.max_word {
            ids.push(self.unk_id);
            return;
        }
        let mark = ids.len();
        let mut start = 0;
        while start < n {
            let mut end = n;
            let mut found = None;
            while start < end {
                let piece = &word[s.bounds[start]..s.bounds[end]];
                let hit = if start == 0 {
                    self.vocab.get(piece)
                } else {
                    s.piece.clear();
                    s.piece.push_str(&self.prefix);
                    s.piece.push_str(piece);
                    self.vocab.get(s.piece.as_str())
                };
                if let Some(&id) = hit {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
            match found {
                Some(id) => ids.push(id),
                None => {
                    ids.truncate(mark);
                    ids.push(self.unk_id);
                    return;
                }
            }
            start = end;
        }
    }
}

#[derive(Default)]
struct Scratch {
    bounds: Vec<usize>,
    piece: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(max_tokens: usize, drop_unk: bool) -> Tokenizer {
        // "A" -> "a", U+00E9 -> "e", "," punctuation, tab and U+3000 whitespace,
        // U+0001 deleted, U+4E00 padded with spaces
        let cm = Charmap::parse(
            "# replaylab charmap 1\n41\to\t61\nE9\to\t65\n2C\tp\t2C\n20\tw\t20\n9\tw\t20\n3000\tw\t20\n1\to\t\n4E00\to\t20 4E00 20\n",
        )
        .unwrap();
        let vocab = ["[PAD]", "[UNK]", "un", "##aff", "##able", "a", ",", "hello", "##e", "\u{4E00}", "##a"];
        Tokenizer::new(cm, &vocab, "[UNK]", "##", 10, 1000, max_tokens, drop_unk).unwrap()
    }

    #[test]
    fn wordpiece_greedy_longest_match() {
        let t = toy(100, true);
        assert_eq!(t.wordpiece_ids("unaffable"), vec![2, 3, 4]);
        assert_eq!(t.wordpiece_ids("unaffablex"), vec![1]); // no match at 'x': the whole word
        assert_eq!(t.wordpiece_ids("aaaaaaaaaaa"), vec![1]); // 11 > max_word 10
        assert_eq!(t.wordpiece_ids("aaaaaaaa"), vec![5, 10, 10, 10, 10, 10, 10, 10]);
    }

    #[test]
    fn normalizes_splits_truncates_and_drops_unk() {
        let t = toy(100, false);
        assert_eq!(t.ids("hello,un\u{1}aff\u{3000}\u{E9}x A\u{4E00}a"), vec![7, 6, 2, 3, 1, 5, 9, 5]);
        assert_eq!(toy(100, true).ids("hello,un\u{1}aff\u{3000}\u{E9}x A\u{4E00}a"), vec![7, 6, 2, 3, 5, 9, 5]);
        // truncate first, then drop unk: the unk among the first 5 ids is dropped, later
        // ids never come back
        assert_eq!(toy(5, true).ids("hello zz , a a a"), vec![7, 6, 5, 5]);
        assert_eq!(toy(100, true).ids(""), Vec::<u32>::new());
    }

    #[test]
    fn refuses_a_bad_charmap() {
        assert!(Charmap::parse("# other\n").is_err());
        assert!(Charmap::parse("# replaylab charmap 1\n41\tx\t61\n").is_err());
        assert!(Charmap::parse("# replaylab charmap 1\nD800\to\t\n").is_err());
        assert!(Charmap::parse("# replaylab charmap 1\n41\to\n").is_err());
    }
}

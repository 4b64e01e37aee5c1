//! A generated English-like text for language-model benches: the same bytes from the same
//! seed on every machine, with no download, and with structure a small model learns in a few
//! hundred steps and keeps improving on after (so the loss curve says something).
//!
//! The structure comes at several ranges, as in real text: letters inside made-up words
//! (syllables of a fixed inventory), word frequencies that follow Zipf's law within each part
//! of speech (frequent words are learned first, rare ones late), sentences from a small
//! grammar with number agreement between a subject and its verb (a noun ending in `s` takes a
//! verb without one, several words apart), capitals after a sentence's end, commas before
//! conjunctions, and lines wrapped at 72 columns in paragraphs.

/// The text's size: a few MB, so that a bench's few hundred steps see each byte about once and
/// the held-out tail (10%) is 400 KB, enough for a steady loss.
pub(crate) const CORPUS_BYTES: usize = 4 << 20;

/// What the generated text looks like; `CorpusSpec::default()` is the bench's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CorpusSpec {
    pub(crate) bytes: usize,
    pub(crate) seed: u64,
}

impl Default for CorpusSpec {
    fn default() -> Self {
        CorpusSpec { bytes: CORPUS_BYTES, seed: 2024 }
    }
}

/// SplitMix64: a whole generator in three lines, so the text cannot change with a library's
/// version.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Words of one part of speech, drawn with Zipf weights (the `k`-th most frequent has weight
/// `1 / k`).
struct Zipf {
    words: Vec<String>,
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(words: Vec<String>) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=words.len())
            .map(|k| {
                total += 1.0 / k as f64;
                total
            })
            .collect();
        Zipf { words, cumulative }
    }

    fn draw(&self, rng: &mut Rng) -> &str {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let x = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let k = self.cumulative.partition_point(|&c| c <= x).min(self.words.len() - 1);
        &self.words[k]
    }
}

/// `count` distinct made-up words of one to three syllables, each a consonant cluster and a
/// vowel, with an optional final consonant; `tail` keeps the parts of speech apart (a noun
/// never ends as a verb does), so the model can tell them by their spelling too.
fn lexicon(rng: &mut Rng, count: usize, tail: &[&str]) -> Vec<String> {
    const ONSETS: [&str; 18] = [
        "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr",
        "pl",
    ];
    const VOWELS: [&str; 7] = ["a", "e", "i", "o", "u", "ai", "ou"];
    let mut words = Vec::with_capacity(count);
    let mut seen = std::collections::HashSet::new();
    while words.len() < count {
        let syllables = 1 + rng.below(3);
        let mut word = String::new();
        for _ in 0..syllables {
            word.push_str(ONSETS[rng.below(ONSETS.len())]);
            word.push_str(VOWELS[rng.below(VOWELS.len())]);
        }
        word.push_str(tail[rng.below(tail.len())]);
        if seen.insert(word.clone()) {
            words.push(word);
        }
    }
    words
}

struct Grammar {
    nouns: Zipf,
    verbs: Zipf,
    adjectives: Zipf,
    adverbs: Zipf,
}

const DETERMINERS: [&str; 4] = ["the", "a", "this", "every"];
const PLURAL_DETERMINERS: [&str; 4] = ["the", "some", "these", "many"];
const PREPOSITIONS: [&str; 6] = ["of", "in", "on", "with", "near", "under"];
const CONJUNCTIONS: [&str; 4] = ["and", "but", "so", "while"];

impl Grammar {
    fn new(rng: &mut Rng) -> Self {
        Grammar {
            nouns: Zipf::new(lexicon(rng, 1200, &["", "n", "r", "l"])),
            verbs: Zipf::new(lexicon(rng, 500, &["t", "k", "d"])),
            adjectives: Zipf::new(lexicon(rng, 300, &["ic", "y", "ish"])),
            adverbs: Zipf::new(lexicon(rng, 80, &["ly"])),
        }
    }

    /// A noun phrase; returns whether it is plural.
    fn noun_phrase(&self, rng: &mut Rng, out: &mut Vec<String>, nested: bool) -> bool {
        let plural = rng.chance(0.35);
        let determiners = if plural { &PLURAL_DETERMINERS } else { &DETERMINERS };
        out.push(determiners[rng.below(determiners.len())].into());
        if rng.chance(0.4) {
            out.push(self.adjectives.draw(rng).into());
        }
        let noun = self.nouns.draw(rng);
        out.push(if plural { format!("{noun}s") } else { noun.into() });
        if !nested && rng.chance(0.25) {
            out.push(PREPOSITIONS[rng.below(PREPOSITIONS.len())].into());
            self.noun_phrase(rng, out, true);
        }
        plural
    }

    /// A clause: a subject, and a verb that agrees with it (singular subjects take `-s`)
    /// after the subject's own modifiers, then an object, an adverb or a place.
    fn clause(&self, rng: &mut Rng, out: &mut Vec<String>) {
        let plural = self.noun_phrase(rng, out, false);
        if rng.chance(0.2) {
            out.push(self.adverbs.draw(rng).into());
        }
        let verb = self.verbs.draw(rng);
        out.push(if plural { verb.into() } else { format!("{verb}s") });
        match rng.below(4) {
            0 | 1 => {
                self.noun_phrase(rng, out, false);
            }
            2 => out.push(self.adverbs.draw(rng).into()),
            _ => {
                out.push(PREPOSITIONS[rng.below(PREPOSITIONS.len())].into());
                self.noun_phrase(rng, out, true);
            }
        }
    }

    fn sentence(&self, rng: &mut Rng) -> String {
        let mut words = Vec::new();
        self.clause(rng, &mut words);
        if rng.chance(0.3) {
            let last = words.len() - 1;
            words[last].push(',');
            words.push(CONJUNCTIONS[rng.below(CONJUNCTIONS.len())].into());
            self.clause(rng, &mut words);
        }
        let mut text = words.join(" ");
        text.push(match rng.below(20) {
            0 => '!',
            1 | 2 => '?',
            _ => '.',
        });
        let mut chars = text.chars();
        chars.next().map_or(String::new(), |c| c.to_ascii_uppercase().to_string() + chars.as_str())
    }
}

/// The text of `spec`: paragraphs of 3 to 8 sentences, lines wrapped at 72 columns, a blank
/// line between paragraphs, `spec.bytes` long (cut at the end of a paragraph past it).
pub(crate) fn generate(spec: &CorpusSpec) -> String {
    let mut rng = Rng(spec.seed);
    let grammar = Grammar::new(&mut rng);
    let mut text = String::with_capacity(spec.bytes + 4096);
    while text.len() < spec.bytes {
        let mut column = 0;
        for _ in 0..3 + rng.below(6) {
            for word in grammar.sentence(&mut rng).split(' ') {
                if column > 0 && column + 1 + word.len() > 72 {
                    text.push('\n');
                    column = 0;
                } else if column > 0 {
                    text.push(' ');
                    column += 1;
                }
                text.push_str(word);
                column += word.len();
            }
        }
        text.push_str("\n\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_text_and_another_seed_another() {
        let spec = CorpusSpec { bytes: 20_000, seed: 1 };
        let text = generate(&spec);
        assert_eq!(text, generate(&spec));
        assert_ne!(text, generate(&CorpusSpec { seed: 2, ..spec }));
        assert!(text.len() >= 20_000 && text.len() < 22_000, "{}", text.len());
        assert!(text.lines().all(|line| line.len() <= 72 || !line.contains(' ')));
        // Sentences start with a capital and end with punctuation.
        assert!(text.starts_with(|c: char| c.is_ascii_uppercase()), "{}", &text[..80]);
        assert!(text.trim_end().ends_with(['.', '?', '!']));
    }
}

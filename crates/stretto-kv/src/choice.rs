//! Closed-choice answers: a map whose instruction lists the answers it allows (`(yes/no)`, `(positive or
//! negative)`, `(choose from plot, acting, …)`) is answered by walking the choices' tokens instead of generating
//! freely.
//!
//! Free generation pays one decoder step per answer token and one more for the end of turn, and a small model's
//! free answer ("The thing sucks!", "Positive" where gold wrote "positive") may be no choice at all. Constrained to
//! the choices, the question pass's logits already pick the answer whenever the choices start with different tokens
//! (one step, as a filter costs); a further step is run only while the remaining choices share the tokens chosen so
//! far. The answer is the choice as the instruction spells it, so every model of a ladder answers in the same words.
//!
//! ```
//! use stretto_kv::choice::closed_choices;
//! assert_eq!(closed_choices("Does it contain spoilers (yes/no)").unwrap(), ["yes", "no"]);
//! // Examples are not a closed list: the answer may be anything like them.
//! assert_eq!(closed_choices("Extract the emotion (e.g., joy, anger)"), None);
//! ```

/// The answers a map instruction allows, when it lists them as a closed set: a list after "choose from", "choose
/// between" or "one of the following" (`(choose from plot, acting, or 'none' if …)`, `Choose from Red, Blue,
/// Green.`), or a parenthesised group closing the instruction whose alternatives are one or two words each,
/// separated by `/` or `or` (`(yes/no)`, `(positive or negative)`). `None` for an open instruction: no such list, a
/// list of examples (`e.g.`, `such as`, `like`), fewer than two choices, a part too long to be an answer (more than
/// four words in a list, two in a closing group), or a closing group that reads as a format (`(DD/MM/YYYY)`, digits).
/// Choices keep the instruction's spelling, without quotes, in order, without duplicates (case-insensitive).
///
/// A closing group is taken at its word: an instruction that describes free text by alternatives (`the sender (name
/// or address)`) is answered with one of them, so word such an instruction otherwise (`the sender's name or
/// address`).
pub fn closed_choices(instruction: &str) -> Option<Vec<String>> {
    let lower = instruction.to_ascii_lowercase();
    for marker in ["choose from", "choose between", "one of the following"] {
        if let Some(at) = lower.find(marker) {
            let rest = instruction[at + marker.len()..].trim_start_matches([':', ' ']);
            let end = rest.find([')', '.', ';', '\n']).unwrap_or(rest.len());
            return choices_of(&rest[..end], &[",", "/", " or "], MAX_CHOICE_WORDS);
        }
    }
    // A parenthesised group closing the instruction: the answer format.
    let body = instruction.trim_end().trim_end_matches(['.', '?', ':', ' ']);
    let inner = body.strip_suffix(')')?;
    let group = &inner[inner.rfind('(')? + 1..];
    let choices = if group.contains('/') {
        choices_of(group, &["/"], MAX_GROUP_WORDS)?
    } else if group.to_ascii_lowercase().contains(" or ") && !group.contains(',') {
        choices_of(group, &[" or "], MAX_GROUP_WORDS)?
    } else {
        return None;
    };
    let format_like = |c: &String| {
        c.chars().any(|ch| ch.is_ascii_digit() || !(ch.is_alphabetic() || ch == ' ' || ch == '-'))
            || (c.chars().count() > 1 && c.chars().all(|ch| ch.is_uppercase()))
    };
    (!choices.iter().any(format_like)).then_some(choices)
}

/// Words that make a list one of examples rather than of answers.
const EXAMPLE_MARKERS: [&str; 6] = ["e.g.", "i.e.", "for example", "such as", "like ", "etc"];

/// Most words a choice of a "choose from" list may have.
const MAX_CHOICE_WORDS: usize = 4;

/// Most words an alternative of a closing parenthesised group may have.
const MAX_GROUP_WORDS: usize = 2;

fn choices_of(list: &str, separators: &[&str], max_words: usize) -> Option<Vec<String>> {
    let lower = list.to_ascii_lowercase();
    if EXAMPLE_MARKERS.iter().any(|m| lower.contains(m)) {
        return None;
    }
    let mut parts = vec![list.to_string()];
    for sep in separators {
        parts = parts.iter().flat_map(|p| split_ci(p, sep)).collect();
    }
    let mut out: Vec<String> = Vec::new();
    for part in parts {
        let Some(choice) = choice_of(&part) else { continue };
        if choice.split_whitespace().count() > max_words {
            return None;
        }
        if !out.iter().any(|c| c.eq_ignore_ascii_case(&choice)) {
            out.push(choice);
        }
    }
    (out.len() >= 2).then_some(out)
}

/// `text` split at every case-insensitive occurrence of `sep`.
fn split_ci(text: &str, sep: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find(sep) {
        out.push(text[from..from + at].to_string());
        from += at + sep.len();
    }
    out.push(text[from..].to_string());
    out
}

/// One list element as a choice: a quoted word wins (`'none' if no aspect is criticized` → `none`); otherwise the
/// element without a leading "or"/"and", a trailing condition (`if …`) or quotes. `None` for an empty element.
fn choice_of(part: &str) -> Option<String> {
    let quoted = |q: char| {
        let s = part.find(q)?;
        let e = part[s + 1..].find(q)? + s + 1;
        Some(part[s + 1..e].to_string())
    };
    let mut t = quoted('\'').or_else(|| quoted('"')).unwrap_or_else(|| part.to_string());
    if let Some(at) = t.to_ascii_lowercase().find(" if ") {
        t.truncate(at);
    }
    let mut t = t.trim().trim_matches(|c: char| c == '"' || c == '\'' || c == '`' || c == ':').trim().to_string();
    for lead in ["or ", "and "] {
        if t.to_ascii_lowercase().starts_with(lead) {
            t = t[lead.len()..].trim().to_string();
        }
    }
    (!t.is_empty()).then_some(t)
}

/// The spellings a model may answer a choice in: as written, lower case, capitalised, each with and without a
/// leading space (an answer after `Label:` usually starts with one).
pub fn spellings(choice: &str) -> Vec<String> {
    let lower = choice.to_lowercase();
    let mut cap = lower.clone();
    if let Some(f) = cap.get(0..1) {
        cap = f.to_uppercase() + &cap[1..];
    }
    let mut out: Vec<String> = Vec::new();
    for s in [choice.to_string(), lower, cap] {
        for v in [format!(" {s}"), s] {
            if !out.contains(&v) {
                out.push(v);
            }
        }
    }
    out
}

/// The token sequences of every spelling of every choice, and which choice each spells: the walk of
/// [`ChoiceTrie::step`].
#[derive(Debug, Clone)]
pub struct ChoiceTrie {
    /// (tokens of one spelling, index of its choice).
    spellings: Vec<(Vec<u32>, usize)>,
}

/// Where a walk stands after one step.
#[derive(Debug, Clone, PartialEq)]
pub enum ChoiceStep {
    /// The choice is decided, with the probability the step gave it among the allowed continuations.
    Done {
        /// Index of the choice.
        choice: usize,
        /// Its share of the allowed continuations' probability at this step.
        probability: f64,
    },
    /// Choices still share the tokens so far: feed `token` and step again with the spellings left.
    Continue {
        /// The token chosen.
        token: u32,
        /// Indices of the spellings that continue with it.
        alive: Vec<usize>,
        /// Its share of the allowed continuations' probability.
        probability: f64,
    },
}

impl ChoiceTrie {
    /// The trie of `spellings` (tokens, choice index); spellings without tokens are ignored.
    pub fn new(spellings: Vec<(Vec<u32>, usize)>) -> Self {
        Self { spellings: spellings.into_iter().filter(|(t, _)| !t.is_empty()).collect() }
    }

    /// Every spelling: where a walk starts.
    pub fn all(&self) -> Vec<usize> {
        (0..self.spellings.len()).collect()
    }

    /// Whether a walk may need a second step: two choices share a first token.
    pub fn may_continue(&self) -> bool {
        self.spellings.iter().any(|(t, c)| self.spellings.iter().any(|(u, d)| d != c && u[0] == t[0]))
    }

    /// One step of the walk at `depth` (tokens already fed) over the `alive` spellings, given the logits after the
    /// tokens fed so far. A spelling that ends here continues with "anything else" (the mass of every token that
    /// no alive spelling continues with); the greedy pick is the most probable continuation.
    pub fn step(&self, alive: &[usize], depth: usize, logits: &[f32]) -> ChoiceStep {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mass = |t: u32| logits.get(t as usize).map_or(0.0, |&l| (l as f64 - max).exp());
        let total: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        // Continuations: next token → spellings taking it.
        let mut next: Vec<(u32, Vec<usize>)> = Vec::new();
        let mut ended: Vec<usize> = Vec::new();
        for &s in alive {
            match self.spellings[s].0.get(depth) {
                Some(&t) => match next.iter_mut().find(|(u, _)| *u == t) {
                    Some((_, v)) => v.push(s),
                    None => next.push((t, vec![s])),
                },
                None => ended.push(s),
            }
        }
        let taken: f64 = next.iter().map(|(t, _)| mass(*t)).sum();
        let end_mass = if ended.is_empty() { 0.0 } else { (total - taken).max(0.0) };
        let allowed = taken + end_mass;
        let share = |m: f64| if allowed > 0.0 { m / allowed } else { 0.0 };
        let choice_of = |s: &usize| self.spellings[*s].1;
        let single = |v: &[usize]| {
            let c = choice_of(v.first()?);
            v.iter().all(|s| choice_of(s) == c).then_some(c)
        };
        let best = next.iter().max_by(|a, b| mass(a.0).total_cmp(&mass(b.0)));
        match best {
            Some((t, v)) if mass(*t) >= end_mass => match single(v) {
                Some(c) => {
                    // Every continuation that can only spell this choice counts for it (" Yes" and "Yes").
                    let m: f64 = next.iter().filter(|(_, w)| single(w) == Some(c)).map(|(u, _)| mass(*u)).sum::<f64>()
                        + if single(&ended) == Some(c) { end_mass } else { 0.0 };
                    ChoiceStep::Done { choice: c, probability: share(m) }
                }
                None => ChoiceStep::Continue { token: *t, alive: v.clone(), probability: share(mass(*t)) },
            },
            _ => {
                // The end wins (or nothing continues): the shortest spelling that ended here decides.
                let c = ended.first().map(choice_of).unwrap_or_else(|| choice_of(&alive[0]));
                ChoiceStep::Done { choice: c, probability: share(end_mass) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_lists_are_read_and_open_ones_are_not() {
        let c = |s: &str| closed_choices(s);
        assert_eq!(c("Extract whether the review contains [spoilers] (yes/no)").unwrap(), ["yes", "no"]);
        assert_eq!(
            c("Extract the [sentiment] of the text above? (positive or negative)").unwrap(),
            ["positive", "negative"]
        );
        assert_eq!(
            c("Extract one aspect that is [criticized] (choose from plot, acting, cinematography, soundtrack, special \
               effects, dialogue, or 'none' if no aspect is criticized)")
            .unwrap(),
            ["plot", "acting", "cinematography", "soundtrack", "special effects", "dialogue", "none"]
        );
        assert_eq!(
            c("Extract the [background] color. Choose from Red, Blue, Yellow, Green.").unwrap(),
            ["Red", "Blue", "Yellow", "Green"]
        );
        assert_eq!(c("Material (stone / wood / metal / undefined)").unwrap(), ["stone", "wood", "metal", "undefined"]);
        assert_eq!(c("Is it good (Yes / yes / no)").unwrap(), ["Yes", "no"], "duplicates dropped");
        // Open instructions.
        assert_eq!(c("Extract the [emotion] (e.g., joy, disappointment, anger)"), None);
        assert_eq!(c("Extract the [fitting] (e.g., regular, comfort); return null if not mentioned"), None);
        assert_eq!(c("Extract the [points] from the report for each player"), None);
        assert_eq!(c("Summarise (whether or not the plot is spoiled by the long second act of the film)"), None);
        assert_eq!(c("Extract the ratio (e.g. 3/4)"), None);
        assert_eq!(c("Extract the date (DD/MM/YYYY)"), None, "a format");
        assert_eq!(c("Extract the size (S/M/L/XL)"), None, "upper-case codes read as a format");
        assert_eq!(c("Extract the version (v1/v2)"), None, "digits");
        assert_eq!(c("Is it cheap (yes/no) and where is it sold"), None, "a group inside the text is not the format");
        assert_eq!(c("Pick one of the following: cat, dog or bird.").unwrap(), ["cat", "dog", "bird"]);
    }

    #[test]
    fn spellings_cover_case_and_the_leading_space() {
        assert_eq!(spellings("yes"), [" yes", "yes", " Yes", "Yes"]);
        assert_eq!(spellings("Red"), [" Red", "Red", " red", "red"]);
    }

    /// Logits putting `p` on given tokens (the rest share what is left).
    fn logits(vocab: usize, peaks: &[(u32, f32)]) -> Vec<f32> {
        let mut l = vec![0.0; vocab];
        for &(t, v) in peaks {
            l[t as usize] = v;
        }
        l
    }

    #[test]
    fn distinct_first_tokens_decide_in_one_step() {
        // choice 0 spelled [1] and [2]; choice 1 spelled [3].
        let trie = ChoiceTrie::new(vec![(vec![1], 0), (vec![2], 0), (vec![3], 1)]);
        assert!(!trie.may_continue());
        let step = trie.step(&trie.all(), 0, &logits(10, &[(2, 5.0), (3, 4.0), (1, 3.0), (7, 9.0)]));
        let ChoiceStep::Done { choice, probability } = step else { panic!("{step:?}") };
        assert_eq!(choice, 0);
        // Both spellings of choice 0 count; token 7 (no choice) does not.
        let (e1, e2, e3) = (3f64.exp(), 5f64.exp(), 4f64.exp());
        assert!((probability - (e1 + e2) / (e1 + e2 + e3)).abs() < 1e-9, "{probability}");
        // The other choice wins when its token leads.
        let step = trie.step(&trie.all(), 0, &logits(10, &[(3, 6.0), (2, 5.0)]));
        assert!(matches!(step, ChoiceStep::Done { choice: 1, .. }), "{step:?}");
    }

    #[test]
    fn a_shared_prefix_continues_until_the_choices_part() {
        // "special effects" [5, 6] and "special mention" [5, 7]; "plot" [8].
        let trie = ChoiceTrie::new(vec![(vec![5, 6], 0), (vec![5, 7], 1), (vec![8], 2)]);
        assert!(trie.may_continue());
        let step = trie.step(&trie.all(), 0, &logits(10, &[(5, 4.0), (8, 1.0)]));
        let ChoiceStep::Continue { token, alive, .. } = step else { panic!("{step:?}") };
        assert_eq!((token, alive.clone()), (5, vec![0, 1]));
        let step = trie.step(&alive, 1, &logits(10, &[(7, 3.0), (6, 2.0)]));
        assert!(matches!(step, ChoiceStep::Done { choice: 1, .. }), "{step:?}");
    }

    #[test]
    fn a_choice_that_is_a_prefix_of_another_ends_on_anything_else() {
        // "no" [4] and "none" [4, 9].
        let trie = ChoiceTrie::new(vec![(vec![4], 0), (vec![4, 9], 1)]);
        let ChoiceStep::Continue { alive, .. } = trie.step(&trie.all(), 0, &logits(10, &[(4, 5.0)])) else { panic!() };
        // After "no", a stop token (0) outweighs "ne": the answer is "no".
        assert!(matches!(trie.step(&alive, 1, &logits(10, &[(0, 8.0), (9, 2.0)])), ChoiceStep::Done { choice: 0, .. }));
        assert!(matches!(trie.step(&alive, 1, &logits(10, &[(9, 8.0)])), ChoiceStep::Done { choice: 1, .. }));
    }
}

//! Normalisation of extracted answers to a map's output type, so every implementation of a map (LLMs of different
//! sizes, generated extractors) produces comparable values: numbers without separators or units, booleans as
//! `true`/`false`, text without quotes, trailing periods or an "Answer:" echo; and, for a closed-choice map
//! ([`stretto_kv::choice`]), one of its choices as listed.

use stretto_core::op::ValueType;

/// The normalised value of `raw`, or `None` if it holds none of the requested type.
pub fn normalize(raw: &str, ty: ValueType) -> Option<String> {
    let line = raw.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.strip_prefix("Answer:").map(str::trim).unwrap_or(line);
    if matches!(line.to_ascii_lowercase().as_str(), "none" | "n/a" | "unknown" | "null" | "") {
        return None;
    }
    match ty {
        ValueType::String => {
            let t = line.trim_matches(|c: char| c == '"' || c == '\'' || c == '`' || c == '.' || c.is_whitespace());
            (!t.is_empty()).then(|| t.to_string())
        }
        ValueType::Integer => first_number(line).and_then(|n| {
            let v: f64 = n.parse().ok()?;
            (v.fract() == 0.0 && v.abs() < 9.0e15).then(|| format!("{}", v as i64))
        }),
        ValueType::Float => first_number(line).and_then(|n| n.parse::<f64>().ok()).map(|v| format!("{v}")),
        ValueType::Boolean => {
            let l = line.to_ascii_lowercase();
            let word = l.split(|c: char| !c.is_alphanumeric()).find(|w| !w.is_empty())?;
            match word {
                "yes" | "true" | "1" | "y" => Some("true".into()),
                "no" | "false" | "0" | "n" => Some("false".into()),
                _ => None,
            }
        }
    }
}

/// The normalised value of `raw` for a map whose instruction may list its answers: with `choices`, the listed choice
/// `raw` names (case aside), normalised like a choice the LLM maps pick, or `None` if it names none of them; without,
/// [`normalize`]. Extractors that do not walk the choices (generated programs) answer in the same words as the LLM
/// maps this way.
pub fn normalize_choice(raw: &str, ty: ValueType, choices: Option<&[String]>) -> Option<String> {
    let Some(choices) = choices else { return normalize(raw, ty) };
    let text = normalize(raw, ValueType::String).unwrap_or_default();
    let choice = choices.iter().find(|c| c.eq_ignore_ascii_case(text.trim()))?;
    normalize(choice, ty)
}

/// The identity a map's answers are memoised under ([`stretto_core::op::PhysicalOp::accept`]): the operator's
/// `name`, or `name#choices` when `instruction` lists closed choices, so that answers given as choices are never read
/// back for free answers memoised before choices were read (or the other way round).
pub fn map_identity(name: &str, instruction: &str) -> String {
    match stretto_kv::choice::closed_choices(instruction) {
        Some(_) => format!("{name}#choices"),
        None => name.to_string(),
    }
}

/// The first number in `text` (digits with an optional sign, decimal point and thousands separators).
fn first_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let start = chars.iter().position(|c| c.is_ascii_digit())?;
    let negative = start > 0 && chars[start - 1] == '-';
    let mut s = String::new();
    if negative {
        s.push('-');
    }
    let mut seen_point = false;
    let mut i = start;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() {
            s.push(c);
        } else if c == ',' && i + 3 < chars.len() + 1 && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
            // Thousands separator: skip.
        } else if c == '.' && !seen_point && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
            seen_point = true;
            s.push('.');
        } else {
            break;
        }
        i += 1;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_normalised_per_type() {
        assert_eq!(normalize("Answer: 1,234 points", ValueType::Integer).as_deref(), Some("1234"));
        assert_eq!(normalize("-3", ValueType::Integer).as_deref(), Some("-3"));
        assert_eq!(normalize("2.5 stars.", ValueType::Integer), None);
        assert_eq!(normalize("about 2.5 stars.", ValueType::Float).as_deref(), Some("2.5"));
        assert_eq!(normalize("\"The Batman\".", ValueType::String).as_deref(), Some("The Batman"));
        assert_eq!(normalize("Yes, it is.", ValueType::Boolean).as_deref(), Some("true"));
        assert_eq!(normalize("NONE", ValueType::String), None);
        assert_eq!(normalize("", ValueType::Float), None);
        assert_eq!(normalize("no digits", ValueType::Integer), None);
    }

    #[test]
    fn a_closed_map_value_is_one_of_its_choices() {
        let choices = ["positive".to_string(), "negative".to_string(), "none".to_string()];
        let c = |raw: &str, ty| normalize_choice(raw, ty, Some(&choices));
        assert_eq!(c("Positive.", ValueType::String).as_deref(), Some("positive"));
        assert_eq!(c("\"NEGATIVE\"", ValueType::String).as_deref(), Some("negative"));
        assert_eq!(c("neutral", ValueType::String), None, "not a choice");
        assert_eq!(c("None", ValueType::String), None, "'none' is no value");
        let yes_no = ["yes".to_string(), "no".to_string()];
        assert_eq!(normalize_choice("Yes", ValueType::Boolean, Some(&yes_no)).as_deref(), Some("true"));
        assert_eq!(normalize_choice("Neutral", ValueType::String, None).as_deref(), Some("Neutral"), "open map");
    }
}

//! What `stretto demo` checks against the data itself: the guarantee it prints is relative to the gold plan, so it
//! also says how often the extracted movie titles name the movie each review is about (the bundled reviews' `id`,
//! a slug such as `spider_man_far_from_home` or `joker_2019`).

use crate::query::QueryReport;

/// The words of a title or slug, lower-case, without "the" and without a trailing year.
fn words(t: &str) -> Vec<String> {
    let mut w: Vec<String> = t
        .to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty() && *w != "the")
        .map(str::to_string)
        .collect();
    if w.last()
        .is_some_and(|y| y.len() == 4 && (y.starts_with("19") || y.starts_with("20")) && y.parse::<u32>().is_ok())
    {
        w.pop();
    }
    w
}

fn contains(long: &[String], short: &[String]) -> bool {
    !short.is_empty() && long.windows(short.len()).any(|w| w == short)
}

/// Whether an extracted title names the movie whose slug is `id`: one's words run contiguously in the other's
/// ("Far From Home" for `spider_man_far_from_home`, "Joker" for `joker_2019`), ignoring case, punctuation, "the"
/// and a trailing year.
pub fn title_matches(title: &str, id: &str) -> bool {
    let (t, i) = (words(title), words(id));
    contains(&i, &t) || contains(&t, &i)
}

/// (right, total) over the result rows that have a `title` and a `reviews.id`.
pub fn title_accuracy(r: &QueryReport) -> (usize, usize) {
    let pairs: Vec<(&str, &str)> =
        r.rows.iter().filter_map(|row| Some((row.get("title")?.as_str()?, row.get("reviews.id")?.as_str()?))).collect();
    (pairs.iter().filter(|(t, i)| title_matches(t, i)).count(), pairs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_match_the_movie_slug_not_invented_ones() {
        assert!(title_matches("Far From Home", "spider_man_far_from_home"));
        assert!(title_matches("Spider-Man: Far From Home", "spider_man_far_from_home"));
        assert!(title_matches("The Joker", "joker_2019"));
        assert!(title_matches("Top Gun: Maverick", "top_gun_maverick"));
        assert!(!title_matches("Gotham City's First Director", "the_batman"));
        assert!(!title_matches("Spider-Man: The Last Stand", "spider_man_far_from_home"));
        assert!(!title_matches("The Big Sleep", "blackkklansman"));
        assert!(!title_matches("", "the_batman"));
        assert!(!title_matches("The", "the_batman"), "a title of only 'the' names nothing");
    }
}

//! "did you mean" for misspelt names: the nearest known name by edit distance.

/// ` (did you mean `x`?)`, or nothing when no known name is close.
pub fn did_you_mean(word: &str, known: &[&str]) -> String {
    nearest(word, known).map_or_else(String::new, |k| format!(" (did you mean `{k}`?)"))
}

/// The known name closest to `word`, if it is within a third of the word's length (at least 1,
/// at most 3 edits) or a prefix of it, comparing case-insensitively.
pub fn nearest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    let limit = (w.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| {
            let k_low = k.to_ascii_lowercase();
            // A cut-short or run-on name (`micro`, `sshKeyss`) is as close as one typo.
            let d = if w.len() >= 3 && (k_low.starts_with(&w) || w.starts_with(&k_low)) {
                1
            } else {
                distance(&w, &k_low)
            };
            (d, *k)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, two rows; words longer than 64 characters are never close.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_one_letter_off_is_found() {
        assert_eq!(nearest("sshKey", &["hostname", "sshKeys", "seed"]), Some("sshKeys"));
    }

    #[test]
    fn nearest_case_differs_is_found() {
        assert_eq!(nearest("sshkeys", &["hostname", "sshKeys"]), Some("sshKeys"));
    }

    #[test]
    fn nearest_unrelated_is_none() {
        assert_eq!(nearest("colour", &["vcpus", "memory", "diskSize"]), None);
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}

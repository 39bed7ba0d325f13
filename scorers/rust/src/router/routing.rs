//! The decision rule (`replaylab.runtime.routing`), in float64.
//!
//! absolute: q_k = p_k; margin: q_k = p_k - (the best OTHER p_j) (ties give 0).
//! Choice: the lowest k with q_k >= threshold, else the fallback column.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Margin,
    Absolute,
}

impl Rule {
    pub fn parse(s: &str) -> Option<Rule> {
        match s {
            "margin" => Some(Rule::Margin),
            "absolute" => Some(Rule::Absolute),
            _ => None,
        }
    }
}

/// Routing scores q of one row.
pub fn scores(p: &[f64], rule: Rule) -> Vec<f64> {
    if rule == Rule::Absolute || p.len() < 2 {
        return p.to_vec();
    }
    // best and second best (a tie for the best: second = best)
    let mut best = f64::NEG_INFINITY;
    let mut second = f64::NEG_INFINITY;
    for &x in p {
        if x > best {
            second = best;
            best = x;
        } else if x > second {
            second = x;
        }
    }
    p.iter().map(|&x| x - if x >= best { second } else { best }).collect()
}

/// The chosen column.
pub fn choose(p: &[f64], threshold: f64, fallback: usize, rule: Rule) -> usize {
    scores(p, rule).iter().position(|&q| q >= threshold).unwrap_or(fallback)
}

/// Distance of the decision from flipping: min over the columns up to and including the
/// chosen one (all columns when none passed) of |q_k - threshold|.
pub fn margin(p: &[f64], threshold: f64, rule: Rule) -> f64 {
    let q = scores(p, rule);
    let upto = q.iter().position(|&x| x >= threshold).unwrap_or(q.len().saturating_sub(1));
    q[..=upto].iter().map(|&x| (x - threshold).abs()).fold(f64::INFINITY, f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_and_absolute_rules() {
        let p = [0.6, 0.9, 0.8];
        assert_eq!(scores(&p, Rule::Margin), vec![0.6 - 0.9, 0.9 - 0.8, 0.8 - 0.9]);
        assert_eq!(choose(&p, -0.35, 2, Rule::Margin), 0);
        assert_eq!(choose(&p, -0.2, 2, Rule::Margin), 1);
        assert_eq!(choose(&p, 0.5, 2, Rule::Margin), 2); // nothing passes: fallback
        assert_eq!(choose(&p, 0.85, 0, Rule::Absolute), 1);
        // a tie for the best: both get 0
        assert_eq!(scores(&[0.7, 0.7, 0.1], Rule::Margin), vec![0.0, 0.0, 0.1 - 0.7]);
        assert!((margin(&p, -0.2, Rule::Margin) - 0.1).abs() < 1e-12); // |0.6-0.9+0.2|, |0.1+0.2|
        assert!((margin(&p, 0.5, Rule::Margin) - 0.4).abs() < 1e-12); // all failed
    }
}

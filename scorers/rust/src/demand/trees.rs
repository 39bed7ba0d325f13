//! The demand model's trees (`trees.safetensors`, docs/specs/demand-scorer.md section 3):
//! LightGBM's node arrays, walked with LightGBM's own decision rule
//! (`Tree::NumericalDecision` / `Tree::CategoricalDecision`) and summed per quantile in
//! file order from 0.0, as `GBDT::PredictRaw` does: the raw scores equal
//! `booster.predict(X, raw_score=True)` bit for bit.
//!
//! A reference is a node index (>= 0) or `!leaf` (< 0, the bitwise complement of a leaf
//! index). Every child index is checked at load to be greater than its parent's (the
//! exporter writes nodes depth first), so every walk ends.

use std::collections::BTreeMap;

use crate::util::error::Error;
use crate::artifact::safetensors::{self, RawTensor};

pub const FORMAT: &str = "replaylab-demand-trees-1";
pub const CATEGORICAL: u8 = 1;
pub const DEFAULT_LEFT: u8 = 2;
pub const MISSING_NONE: u8 = 0;
pub const MISSING_ZERO: u8 = 1;
pub const MISSING_NAN: u8 = 2;
/// LightGBM's kZeroThreshold: the float 1e-35f widened to double.
pub const K_ZERO: f64 = 1e-35f32 as f64;

/// One node as the walk reads it (the arrays interleaved at load: one or two cache lines
/// per visit instead of five).
#[derive(Clone, Copy, Debug)]
struct Node {
    threshold: f64,
    left: i32,
    right: i32,
    feature: u32,
    cat_lo: u32,
    cat_hi: u32,
    decision: u8,
}

pub struct Trees {
    pub tree_output: Vec<usize>,
    pub tree_root: Vec<i32>,
    pub feature: Vec<usize>,
    pub threshold: Vec<f64>,
    pub decision: Vec<u8>,
    pub left: Vec<i32>,
    pub right: Vec<i32>,
    pub cat_offset: Vec<usize>,
    pub cat_values: Vec<i32>,
    pub leaf_value: Vec<f64>,
    /// each leaf's index within its tree (LightGBM's `leaf_index`, `pred_leaf=True`)
    pub leaf_index: Vec<i32>,
    pub n_outputs: usize,
    pub n_features: usize,
    nodes: Vec<Node>,
}

fn bad(m: String) -> Error {
    Error::new("trees", format!("trees.safetensors: {m}"))
}

fn tensor<'a>(t: &'a BTreeMap<String, RawTensor<'a>>, name: &str, dtype: &str) -> Result<&'a RawTensor<'a>, Error> {
    let x = t.get(name).ok_or_else(|| bad(format!("no tensor {name:?}")))?;
    if x.dtype != dtype || x.shape.len() != 1 {
        return Err(bad(format!("{name}: {} {:?}, expected a 1-d {dtype}", x.dtype, x.shape)));
    }
    Ok(x)
}

fn i32s(t: &BTreeMap<String, RawTensor>, name: &str) -> Result<Vec<i32>, Error> {
    Ok(tensor(t, name, "I32")?.bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

fn f64s(t: &BTreeMap<String, RawTensor>, name: &str) -> Result<Vec<f64>, Error> {
    Ok(tensor(t, name, "F64")?.bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect())
}

fn indexes(v: Vec<i32>, bound: usize, name: &str) -> Result<Vec<usize>, Error> {
    v.into_iter().map(|x| usize::try_from(x).ok().filter(|&u| u < bound)
        .ok_or_else(|| bad(format!("{name}: {x} outside 0..{bound}")))).collect()
}

impl Trees {
    /// Parse and check the arrays; `n_features` / `quantiles` come from the manifest
    /// and must equal the file's metadata.
    pub fn parse(bytes: &[u8], n_features: usize, quantiles: &[f64]) -> Result<Trees, Error> {
        let (t, meta) = safetensors::read_raw(bytes, "trees.safetensors")?;
        if meta.get("format").map(String::as_str) != Some(FORMAT) {
            return Err(bad(format!("__metadata__.format {:?}, expected {FORMAT:?}", meta.get("format"))));
        }
        if meta.get("n_features").and_then(|s| s.parse::<usize>().ok()) != Some(n_features) {
            return Err(bad(format!("n_features {:?}, the manifest has {n_features} features", meta.get("n_features"))));
        }
        let qs: Option<Vec<f64>> = meta.get("quantiles").map(|s| s.split(',').map(|q| q.parse().ok()).collect()).unwrap_or(None);
        if qs.as_deref() != Some(quantiles) {
            return Err(bad(format!("quantiles {:?} differ from the manifest's {quantiles:?}", meta.get("quantiles"))));
        }
        let n_outputs = quantiles.len();
        let feature_raw = i32s(&t, "node_feature")?;
        let n = feature_raw.len();
        let threshold = f64s(&t, "node_threshold")?;
        let decision = tensor(&t, "node_decision", "U8")?.bytes.to_vec();
        let left = i32s(&t, "node_left")?;
        let right = i32s(&t, "node_right")?;
        let leaf_value = f64s(&t, "leaf_value")?;
        let leaf_index = i32s(&t, "leaf_index")?;
        if leaf_index.len() != leaf_value.len() {
            return Err(bad("leaf_index and leaf_value differ in length".into()));
        }
        let cat_values = i32s(&t, "cat_values")?;
        let cat_offset = indexes(i32s(&t, "node_cat_offset")?, cat_values.len() + 1, "node_cat_offset")?;
        let tree_root = i32s(&t, "tree_root")?;
        let tree_output = indexes(i32s(&t, "tree_output")?, n_outputs, "tree_output")?;
        if [threshold.len(), decision.len(), left.len(), right.len()].iter().any(|&l| l != n) || cat_offset.len() != n + 1 {
            return Err(bad("node arrays of different lengths".into()));
        }
        if tree_root.len() != tree_output.len() {
            return Err(bad("tree_root and tree_output differ in length".into()));
        }
        let feature = indexes(feature_raw, n_features, "node_feature")?;
        let leaves = leaf_value.len();
        let valid = |r: i32, parent: Option<usize>| -> bool {
            if r < 0 {
                ((!r) as usize) < leaves
            } else {
                (r as usize) < n && parent.is_none_or(|p| r as usize > p)
            }
        };
        for i in 0..n {
            if !valid(left[i], Some(i)) || !valid(right[i], Some(i)) {
                return Err(bad(format!("node {i}: a child outside the arrays or not after its parent")));
            }
            let d = decision[i];
            if d > 15 || (d >> 2) == 3 {
                return Err(bad(format!("node {i}: decision_type {d} is not one LightGBM writes here")));
            }
            if cat_offset[i] > cat_offset[i + 1] || (d & CATEGORICAL == 0 && cat_offset[i] != cat_offset[i + 1]) {
                return Err(bad(format!("node {i}: bad category range")));
            }
            let cats = &cat_values[cat_offset[i]..cat_offset[i + 1]];
            if cats.windows(2).any(|w| w[0] >= w[1]) || cats.iter().any(|&c| c < 0) {
                return Err(bad(format!("node {i}: categories not ascending non-negative codes")));
            }
        }
        if cat_offset.first() != Some(&0) || cat_offset.last() != Some(&cat_values.len()) {
            return Err(bad("node_cat_offset does not span cat_values".into()));
        }
        if let Some(r) = tree_root.iter().find(|&&r| !valid(r, None)) {
            return Err(bad(format!("tree_root {r} outside the arrays")));
        }
        Ok(Trees { tree_output, tree_root, feature, threshold, decision, left, right, cat_offset,
                   cat_values, leaf_value, leaf_index, n_outputs, n_features, nodes: Vec::new() }.packed())
    }

    /// Interleave the node arrays for the walk (call after building the arrays).
    pub fn packed(mut self) -> Trees {
        self.nodes = (0..self.feature.len()).map(|i| Node {
            threshold: self.threshold[i], left: self.left[i], right: self.right[i],
            feature: self.feature[i] as u32, cat_lo: self.cat_offset[i] as u32,
            cat_hi: self.cat_offset[i + 1] as u32, decision: self.decision[i],
        }).collect();
        self
    }

    pub fn n_trees(&self) -> usize {
        self.tree_root.len()
    }

    /// LightGBM's `Tree::Decision` at node `i` for value `x`: true = left.
    pub fn goes_left(&self, i: usize, x: f64) -> bool {
        self.decide(&self.nodes[i], x)
    }

    #[inline(always)]
    fn decide(&self, n: &Node, x: f64) -> bool {
        let d = n.decision;
        if d & CATEGORICAL != 0 {
            if x.is_nan() {
                return false;
            }
            let code = x as i32; // static_cast<int>: truncation toward zero (saturating here)
            return code >= 0 && self.cat_values[n.cat_lo as usize..n.cat_hi as usize].binary_search(&code).is_ok();
        }
        if d & 0b1100 == 0 {
            // missing type None: NaN is 0.0, then compared
            return if x.is_nan() { 0.0 } else { x } <= n.threshold;
        }
        let missing = (d >> 2) & 3;
        let x = if x.is_nan() && missing != MISSING_NAN { 0.0 } else { x };
        if (missing == MISSING_ZERO && (-K_ZERO..=K_ZERO).contains(&x)) || (missing == MISSING_NAN && x.is_nan()) {
            return d & DEFAULT_LEFT != 0;
        }
        x <= n.threshold
    }

    /// The leaf tree `t` reaches for feature row `x`.
    #[inline]
    pub fn leaf(&self, t: usize, x: &[f64]) -> usize {
        let mut node = self.tree_root[t];
        while node >= 0 {
            let n = &self.nodes[node as usize];
            node = if self.decide(n, x[n.feature as usize]) { n.left } else { n.right };
        }
        (!node) as usize
    }

    /// Raw scores (n_outputs) of one feature row (n_features float64; NaN = missing).
    pub fn predict(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.n_features, "feature row width");
        let mut out = vec![0.0f64; self.n_outputs];
        for t in 0..self.n_trees() {
            out[self.tree_output[t]] += self.leaf_value[self.leaf(t, x)];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees(decision: u8, threshold: f64, cats: &[i32]) -> Trees {
        // one stump: node 0 on feature 0, left leaf 0 (value 1.0), right leaf 1 (value 2.0)
        Trees { tree_output: vec![0], tree_root: vec![0], feature: vec![0], threshold: vec![threshold],
                decision: vec![decision], left: vec![!0], right: vec![!1],
                cat_offset: vec![0, cats.len()], cat_values: cats.to_vec(), leaf_value: vec![1.0, 2.0],
                leaf_index: vec![0, 1],
                n_outputs: 1, n_features: 1, nodes: Vec::new() }.packed()
    }

    #[test]
    fn numerical_missing_rules() {
        // missing None: NaN is 0.0, compared
        assert_eq!(trees(0, 0.5, &[]).predict(&[f64::NAN]), vec![1.0]);
        assert_eq!(trees(0, -0.5, &[]).predict(&[f64::NAN]), vec![2.0]);
        assert_eq!(trees(0, 0.5, &[]).predict(&[0.5]), vec![1.0]); // <=
        // missing NaN: NaN to the default side only
        assert_eq!(trees(MISSING_NAN << 2, 0.5, &[]).predict(&[f64::NAN]), vec![2.0]);
        assert_eq!(trees((MISSING_NAN << 2) | DEFAULT_LEFT, -9.0, &[]).predict(&[f64::NAN]), vec![1.0]);
        assert_eq!(trees((MISSING_NAN << 2) | DEFAULT_LEFT, -9.0, &[]).predict(&[0.0]), vec![2.0]);
        // missing Zero: NaN and |x| <= 1e-35f to the default side
        let z = trees((MISSING_ZERO << 2) | DEFAULT_LEFT, -1.0, &[]);
        assert_eq!(z.predict(&[f64::NAN]), vec![1.0]);
        assert_eq!(z.predict(&[1e-36]), vec![1.0]);
        assert_eq!(z.predict(&[1e-30]), vec![2.0]);
    }

    #[test]
    fn categorical_rules() {
        let c = trees(CATEGORICAL, 0.0, &[1, 3]);
        assert_eq!(c.predict(&[1.0]), vec![1.0]);
        assert_eq!(c.predict(&[3.9]), vec![1.0]); // truncated to 3
        assert_eq!(c.predict(&[2.0]), vec![2.0]);
        assert_eq!(c.predict(&[f64::NAN]), vec![2.0]);
        assert_eq!(c.predict(&[-1.0]), vec![2.0]);
    }
}

//! The router head's forward pass from `head.safetensors`, in float64 (every float32
//! weight widened exactly). docs/specs/router-scorer.md, "Head", has the arithmetic; the Python
//! serving head is `replaylab.runtime.router_head.NumpyHead` (float64 too, with the linear
//! steps around layer 0 and the success layer folded at load: the same function, other
//! rounding, ~1e-15).
//!
//! Each matrix is transposed at load, so that a layer is `for j { for i { acc[i] +=
//! w[i][j] * z[j] } }`: every output still sums its products in input order j = 0, 1,
//! ... (one fixed order, no FMA), and the inner loop over outputs vectorizes.

use std::collections::BTreeMap;

use crate::util::error::Error;
use crate::artifact::safetensors::Tensor;

struct Layer {
    /// transposed weight: wt[j * out + i] = W[i][j]
    wt: Vec<f64>,
    b: Vec<f64>,
    inp: usize,
    out: usize,
}

impl Layer {
    fn from(w: &Tensor, b: &Tensor, name: &str) -> Result<Layer, Error> {
        if w.shape.len() != 2 || b.shape != [w.shape[0]] {
            return Err(bad(format!("{name}: weight {:?}, bias {:?}", w.shape, b.shape)));
        }
        let (out, inp) = (w.shape[0], w.shape[1]);
        let mut wt = vec![0.0; out * inp];
        for i in 0..out {
            for j in 0..inp {
                wt[j * out + i] = w.data[i * inp + j] as f64;
            }
        }
        Ok(Layer { wt, b: widen(b), inp, out })
    }

    /// y = W z + b: products summed in input order, then the bias added (numpy's
    /// `h = w @ h; h += b`). Inputs equal to 0 (half of them after a ReLU) are skipped:
    /// adding w x 0 = ±0 leaves a sum unchanged, so the result is the full sum's. Four
    /// inputs per pass over the outputs, still added one after the other.
    #[inline]
    fn forward(&self, z: &[f64], y: &mut Vec<f64>, nz: &mut Vec<usize>) {
        let out = self.out;
        y.clear();
        y.resize(out, 0.0);
        nz.clear();
        nz.extend(z.iter().enumerate().filter(|(_, &v)| v != 0.0).map(|(j, _)| j));
        let mut quads = nz.chunks_exact(4);
        for q in &mut quads {
            let (z0, z1, z2, z3) = (z[q[0]], z[q[1]], z[q[2]], z[q[3]]);
            let c0 = &self.wt[q[0] * out..(q[0] + 1) * out];
            let c1 = &self.wt[q[1] * out..(q[1] + 1) * out];
            let c2 = &self.wt[q[2] * out..(q[2] + 1) * out];
            let c3 = &self.wt[q[3] * out..(q[3] + 1) * out];
            for ((((a, &w0), &w1), &w2), &w3) in y.iter_mut().zip(c0).zip(c1).zip(c2).zip(c3) {
                let mut v = *a;
                v += w0 * z0;
                v += w1 * z1;
                v += w2 * z2;
                v += w3 * z3;
                *a = v;
            }
        }
        for &j in quads.remainder() {
            let zj = z[j];
            for (acc, &w) in y.iter_mut().zip(&self.wt[j * out..(j + 1) * out]) {
                *acc += w * zj;
            }
        }
        for (acc, &b) in y.iter_mut().zip(&self.b) {
            *acc += b;
        }
    }
}

fn bad(m: String) -> Error {
    Error::new("bad_config", format!("head.safetensors: {m}"))
}

fn widen(t: &Tensor) -> Vec<f64> {
    t.data.iter().map(|&x| x as f64).collect()
}

pub struct Head {
    pub d: usize,
    pub c: usize,
    /// V, the number of category labels; code V is `other`
    pub v: usize,
    pub k: usize,
    emb_mean: Vec<f64>,
    emb_scale: Vec<f64>,
    tok_mean: f64,
    tok_scale: f64,
    category: Vec<f64>,
    layers: Vec<Layer>,
    success: Layer,
    platt_a: Vec<f64>,
    platt_b: Vec<f64>,
    wide_category: Option<Vec<f64>>,
    wide_tokens: Option<Vec<f64>>,
}

impl Head {
    pub fn from_tensors(t: &BTreeMap<String, Tensor>, n_labels: usize) -> Result<Head, Error> {
        let get = |n: &str| t.get(n).ok_or_else(|| bad(format!("no tensor {n:?}")));
        let vec1 = |n: &str, len: Option<usize>| -> Result<&Tensor, Error> {
            let x = get(n)?;
            if x.shape.len() != 1 || len.is_some_and(|l| x.shape[0] != l) {
                return Err(bad(format!("{n} has shape {:?}", x.shape)));
            }
            Ok(x)
        };
        let mean = vec1("emb_mean", None)?;
        let d = mean.shape[0];
        let scale = vec1("emb_scale", Some(d))?;
        let tok_mean = vec1("tok_mean", Some(1))?.data[0] as f64;
        let tok_scale = vec1("tok_scale", Some(1))?.data[0] as f64;
        let cat = get("category")?;
        if cat.shape.len() != 2 || cat.shape[0] != n_labels + 1 {
            return Err(bad(format!("category {:?} for {n_labels} labels (+1 other)", cat.shape)));
        }
        let c = cat.shape[1];
        let mut layers = Vec::new();
        let mut width = d + c + 1;
        while let Some(w) = t.get(&format!("layer{}.weight", layers.len())) {
            let i = layers.len();
            let l = Layer::from(w, get(&format!("layer{i}.bias"))?, &format!("layer{i}"))?;
            if l.inp != width {
                return Err(bad(format!("layer{i} takes {} inputs, expected {width}", l.inp)));
            }
            width = l.out;
            layers.push(l);
        }
        if layers.is_empty() {
            return Err(bad("no layer0.weight".into()));
        }
        let success = Layer::from(get("success.weight")?, get("success.bias")?, "success")?;
        if success.inp != width {
            return Err(bad(format!("success takes {} inputs, expected {width}", success.inp)));
        }
        let k = success.out;
        let platt_a = widen(vec1("platt_a", Some(k))?);
        let platt_b = widen(vec1("platt_b", Some(k))?);
        let wide_category = match t.get("wide_category") {
            Some(w) if w.shape == [n_labels + 1, k] => Some(widen(w)),
            Some(w) => return Err(bad(format!("wide_category {:?}", w.shape))),
            None => None,
        };
        let wide_tokens = match t.get("wide_tokens") {
            Some(_) => Some(widen(vec1("wide_tokens", Some(k))?)),
            None => None,
        };
        Ok(Head { d, c, v: n_labels, k, emb_mean: widen(mean), emb_scale: widen(scale), tok_mean, tok_scale,
                  category: widen(cat), layers, success, platt_a, platt_b, wide_category, wide_tokens })
    }

    /// The standardized log prompt length x: (log1p(max(t, 0)) - tok_mean) / tok_scale;
    /// NaN (unknown) -> 0, the training mean.
    pub fn token_feature(&self, t: f64) -> f64 {
        if t.is_nan() {
            return 0.0;
        }
        (t.max(0.0).ln_1p() - self.tok_mean) / self.tok_scale
    }

    /// P(success) per candidate (K) of one query: embedding (d, float32), category code
    /// in [0, V] (V = other), prompt tokens t.
    pub fn proba(&self, emb: &[f32], code: usize, t: f64) -> Vec<f64> {
        assert_eq!(emb.len(), self.d, "embedding dimension");
        let code = code.min(self.v);
        let x = self.token_feature(t);
        let mut z = Vec::with_capacity(self.d + self.c + 1);
        for ((&e, &m), &s) in emb.iter().zip(&self.emb_mean).zip(&self.emb_scale) {
            z.push((e as f64 - m) / s);
        }
        z.extend_from_slice(&self.category[code * self.c..(code + 1) * self.c]);
        z.push(x);
        let mut h = Vec::new();
        let mut nz = Vec::with_capacity(z.len());
        for l in &self.layers {
            l.forward(&z, &mut h, &mut nz);
            for v in h.iter_mut() {
                *v = v.max(0.0); // ReLU
            }
            std::mem::swap(&mut z, &mut h);
        }
        let mut s = Vec::new();
        self.success.forward(&z, &mut s, &mut nz);
        if let Some(wc) = &self.wide_category {
            for (sk, w) in s.iter_mut().zip(&wc[code * self.k..(code + 1) * self.k]) {
                *sk += w;
            }
        }
        if let Some(wt) = &self.wide_tokens {
            for (sk, w) in s.iter_mut().zip(wt) {
                *sk += w * x;
            }
        }
        s.iter()
            .enumerate()
            .map(|(k, &sk)| 1.0 / (1.0 + (-(self.platt_a[k] * sk + self.platt_b[k])).exp()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: &[f32]) -> Tensor {
        Tensor { shape: shape.to_vec(), data: data.to_vec() }
    }

    #[test]
    fn forward_of_a_toy_head() {
        // d = 2, c = 1, V = 1, one hidden layer of 2, K = 2
        let mut m = BTreeMap::new();
        m.insert("emb_mean".into(), t(&[2], &[0.5, 0.0]));
        m.insert("emb_scale".into(), t(&[2], &[2.0, 1.0]));
        m.insert("tok_mean".into(), t(&[1], &[1.0]));
        m.insert("tok_scale".into(), t(&[1], &[0.5]));
        m.insert("category".into(), t(&[2, 1], &[1.0, 0.0]));
        m.insert("layer0.weight".into(), t(&[2, 4], &[1.0, 0.0, 1.0, 0.5, 0.0, -1.0, 0.0, 0.0]));
        m.insert("layer0.bias".into(), t(&[2], &[0.0, 0.25]));
        m.insert("success.weight".into(), t(&[2, 2], &[1.0, 1.0, -1.0, 2.0]));
        m.insert("success.bias".into(), t(&[2], &[0.0, 0.5]));
        m.insert("platt_a".into(), t(&[2], &[1.0, 2.0]));
        m.insert("platt_b".into(), t(&[2], &[0.0, -1.0]));
        let h = Head::from_tensors(&m, 1).unwrap();
        let emb = [1.5f32, -1.0];
        let tok = 3.0f64;
        let x = ((tok.ln_1p()) - 1.0) / 0.5;
        // z = [(1.5-0.5)/2, -1, category[0] = 1, x]
        let z = [0.5, -1.0, 1.0, x];
        let h0 = (1.0 * z[0] + 1.0 * z[2] + 0.5 * z[3]).max(0.0);
        let h1 = (1.0f64 + 0.25).max(0.0);
        let s = [h0 + h1, -h0 + 2.0 * h1 + 0.5];
        let want = [1.0 / (1.0 + (-s[0]).exp()), 1.0 / (1.0 + (-(2.0 * s[1] - 1.0)).exp())];
        let got = h.proba(&emb, 0, tok);
        for k in 0..2 {
            assert!((got[k] - want[k]).abs() < 1e-15, "{got:?} {want:?}");
        }
        // unknown tokens: x = 0; code beyond V: other
        let got = h.proba(&emb, 7, f64::NAN);
        let h0 = (0.5f64).max(0.0);
        let s0 = h0 + h1;
        assert!((got[0] - 1.0 / (1.0 + (-s0).exp())).abs() < 1e-15);
        // shape errors are refused
        m.insert("layer0.weight".into(), t(&[2, 3], &[0.0; 6]));
        assert!(Head::from_tensors(&m, 1).is_err());
    }
}

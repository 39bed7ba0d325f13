//! The static encoder: token ids -> sum of embedding rows in float64 (token order) ->
//! L2 normalization in float64 -> float32 (docs/specs/router-scorer.md, "Embedding").

use crate::router::tokenizer::Tokenizer;

pub struct StaticEncoder {
    pub tokenizer: Tokenizer,
    /// [vocab_size, d] row-major
    pub table: Vec<f32>,
    pub d: usize,
    pub normalize: bool,
}

impl StaticEncoder {
    pub fn pool(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.d;
        let mut s = vec![0.0f64; d];
        for &id in ids {
            let row = &self.table[id as usize * d..(id as usize + 1) * d];
            for (acc, &x) in s.iter_mut().zip(row) {
                *acc += x as f64;
            }
        }
        if ids.is_empty() {
            return vec![0.0; d];
        }
        if !self.normalize {
            let n = ids.len() as f64;
            return s.iter().map(|&x| (x / n) as f32).collect();
        }
        let mut n2 = 0.0f64;
        for &x in &s {
            n2 += x * x;
        }
        let norm = n2.sqrt();
        if norm > 0.0 {
            s.iter().map(|&x| (x / norm) as f32).collect()
        } else {
            s.iter().map(|&x| x as f32).collect()
        }
    }

    /// (token ids, embedding) of one text.
    pub fn encode(&self, text: &str) -> (Vec<u32>, Vec<f32>) {
        let ids = self.tokenizer.ids(text);
        let v = self.pool(&ids);
        (ids, v)
    }
}

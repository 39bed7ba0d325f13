//! safetensors reader (F32 only): 8-byte little-endian u64 header length N, N bytes of
//! JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?},
//! then the data; offsets are relative to the first byte after the header.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::json::{self, Json};

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    /// Row-major (C order) values.
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Every tensor of a safetensors file; any dtype other than F32 is refused.
pub fn read(data: &[u8], what: &str) -> Result<BTreeMap<String, Tensor>, Error> {
    let bad = |m: String| Error::new("safetensors", format!("{what}: {m}"));
    if data.len() < 8 {
        return Err(bad("file shorter than its 8-byte header length".into()));
    }
    let n = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    if n == 0 || n > (data.len() - 8) as u64 {
        return Err(bad(format!("header length {n} outside the file")));
    }
    let n = n as usize;
    let header = json::parse_bytes(&data[8..8 + n]).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let entries = header.as_object().ok_or_else(|| bad("header is not a JSON object".into()))?;
    let body = &data[8 + n..];
    let mut out = BTreeMap::new();
    for (name, spec) in entries {
        if name == "__metadata__" {
            continue;
        }
        let dtype = spec.get("dtype").and_then(Json::as_str);
        if dtype != Some("F32") {
            return Err(bad(format!("tensor {name:?}: dtype {dtype:?}, only F32 is read")));
        }
        let shape: Option<Vec<usize>> = spec.get("shape").and_then(Json::as_array).and_then(|a| {
            a.iter().map(|x| x.as_i64().and_then(|v| usize::try_from(v).ok())).collect()
        });
        let offs: Option<Vec<usize>> = spec.get("data_offsets").and_then(Json::as_array).and_then(|a| {
            a.iter().map(|x| x.as_i64().and_then(|v| usize::try_from(v).ok())).collect()
        });
        let (Some(shape), Some(offs)) = (shape, offs) else {
            return Err(bad(format!("tensor {name:?}: bad entry")));
        };
        if offs.len() != 2 {
            return Err(bad(format!("tensor {name:?}: data_offsets must be [begin, end]")));
        }
        let count = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        let (begin, end) = (offs[0], offs[1]);
        if begin > end || end > body.len() || count.and_then(|c| c.checked_mul(4)) != Some(end - begin) {
            return Err(bad(format!("tensor {name:?}: offsets {begin}..{end} do not hold {shape:?} F32")));
        }
        let data = body[begin..end]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(name.clone(), Tensor { shape, data });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[f32]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        for v in data {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    #[test]
    fn reads_f32_tensors() {
        let h = r#"{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}"#;
        let t = read(&file(h, &[1.0, 2.0, 3.0, -4.5, 7.25]), "t").unwrap();
        assert_eq!(t["a"].shape, vec![2, 2]);
        assert_eq!(t["a"].data, vec![1.0, 2.0, 3.0, -4.5]);
        assert_eq!(t["b"].data, vec![7.25]);
    }

    #[test]
    fn refuses_bad_files() {
        assert!(read(b"\x01\x00", "t").is_err());
        let h = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        assert!(read(&file(h, &[1.0, 2.0]), "t").is_err()); // shape vs offsets
        let h = r#"{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
        assert!(read(&file(h, &[1.0, 2.0]), "t").is_err()); // dtype
        let h = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        assert!(read(&file(h, &[1.0, 2.0]), "t").is_err()); // past the end
        let mut f = file(r#"{"a":1}"#, &[]);
        f[0] = 200;
        assert!(read(&f, "t").is_err()); // header length outside the file
    }
}

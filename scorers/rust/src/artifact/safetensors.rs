//! safetensors reader (F32 only): 8-byte little-endian u64 header length N, N bytes of
//! JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?},
//! then the data; offsets are relative to the first byte after the header.

use std::collections::BTreeMap;

use crate::util::error::Error;
use crate::util::json::{self, Json};

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

/// A tensor of any dtype: its header entry and its little-endian bytes (the demand
/// trees' F64 / I32 / U8 arrays are read through this; `read` keeps to F32).
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor<'a> {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
}

/// The byte width of a safetensors dtype (None: unknown).
pub fn dtype_size(dtype: &str) -> Option<usize> {
    match dtype {
        "F64" | "I64" | "U64" => Some(8),
        "F32" | "I32" | "U32" => Some(4),
        "F16" | "BF16" | "I16" | "U16" => Some(2),
        "I8" | "U8" | "BOOL" => Some(1),
        _ => None,
    }
}

/// A file's tensors by name and its `__metadata__` (string values).
pub type RawFile<'a> = (BTreeMap<String, RawTensor<'a>>, BTreeMap<String, String>);

/// Every tensor of a safetensors file as raw bytes, and its `__metadata__`.
pub fn read_raw<'a>(data: &'a [u8], what: &str) -> Result<RawFile<'a>, Error> {
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
    let mut meta = BTreeMap::new();
    for (name, spec) in entries {
        if name == "__metadata__" {
            for (k, v) in spec.as_object().ok_or_else(|| bad("__metadata__ is not an object".into()))? {
                let v = v.as_str().ok_or_else(|| bad(format!("__metadata__.{k} is not a string")))?;
                meta.insert(k.clone(), v.to_string());
            }
            continue;
        }
        let dtype = spec.get("dtype").and_then(Json::as_str).unwrap_or("");
        let size = dtype_size(dtype).ok_or_else(|| bad(format!("tensor {name:?}: unknown dtype {dtype:?}")))?;
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
        if begin > end || end > body.len() || count.and_then(|c| c.checked_mul(size)) != Some(end - begin) {
            return Err(bad(format!("tensor {name:?}: offsets {begin}..{end} do not hold {shape:?} {dtype}")));
        }
        out.insert(name.clone(), RawTensor { dtype: dtype.to_string(), shape, bytes: &body[begin..end] });
    }
    Ok((out, meta))
}

/// Every tensor of a safetensors file; any dtype other than F32 is refused.
pub fn read(data: &[u8], what: &str) -> Result<BTreeMap<String, Tensor>, Error> {
    let mut out = BTreeMap::new();
    for (name, t) in read_raw(data, what)?.0 {
        if t.dtype != "F32" {
            return Err(Error::new("safetensors", format!("{what}: tensor {name:?}: dtype {:?}, only F32 is read", t.dtype)));
        }
        let data = t.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        out.insert(name, Tensor { shape: t.shape, data });
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

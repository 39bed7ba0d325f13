//! The check aids: `canon` (canonical JSON of stdin), `sha256 FILE...`, `safetensors FILE`
//! (its F32 tensors as JSON): the Python tests compare each with the Python implementation.

use std::collections::BTreeMap;
use std::io::Read;

use replaylab_scorer::artifact::safetensors;
use replaylab_scorer::util::json::{self, Json, Number};
use replaylab_scorer::util::sha256 as hash;
use replaylab_scorer::Error;

use super::{emit, usage};

pub fn canon() -> Result<u8, Error> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).map_err(|e| Error::new("io", e.to_string()))?;
    let v = json::parse(&s).map_err(|e| Error::new("invalid_json", e.to_string()))?;
    emit(&json::canonical(&v).map_err(|e| Error::new("invalid_json", e))?);
    Ok(0)
}

pub fn sha256(args: &[String]) -> Result<u8, Error> {
    for f in &args[1..] {
        let data = std::fs::read(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
        emit(&format!("{}  {f}", hash::sha256_hex(&data)));
    }
    Ok(0)
}

pub fn safetensors(args: &[String]) -> Result<u8, Error> {
    let f = args.get(1).ok_or_else(|| usage("safetensors FILE"))?;
    let data = std::fs::read(f).map_err(|e| Error::new("missing_file", format!("{f}: {e}")))?;
    let mut m = BTreeMap::new();
    for (name, t) in safetensors::read(&data, f)? {
        let mut e = BTreeMap::new();
        let int = |x: usize| Json::Num(Number { value: x as f64, int: Some(x.to_string()) });
        e.insert("shape".to_string(), Json::Arr(t.shape.iter().map(|&x| int(x)).collect()));
        e.insert("data".to_string(), Json::Arr(t.data.iter()
            .map(|&x| Json::Num(Number { value: x as f64, int: None })).collect()));
        m.insert(name, Json::Obj(e));
    }
    emit(&json::canonical(&Json::Obj(m)).map_err(|e| Error::new("safetensors", e))?);
    Ok(0)
}

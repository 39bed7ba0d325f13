//! Artifact manifests (schema 1, docs/specs/artifacts.md): the checks of
//! `replaylab.contracts.manifest.verify_manifest`, in its order, without HMAC
//! signatures (a signature, when present, is not checked: the Python runtime checks
//! one only when handed a key).
//!
//! readable JSON object -> schema_version "1" -> structure (every field and its JSON
//! type; each files entry: path, 64 lowercase hex sha256, integer size >= 0, no
//! duplicate path) -> kind -> content_hash (sha256 of the canonical JSON of
//! {files, features, outputs, calibration, training}, recomputed) -> validity period
//! (created_at <= now + 5 min, now <= valid_until) -> each listed file: a path that
//! cannot leave the folder, present, a regular file, its size, its sha256.
//!
//! Files are read once, through [`Store`]: the bytes that were hashed are the bytes
//! that are used (no check-then-open race), and a file listed by two manifests (the
//! router's lists `encoder/<file>` too) is read and hashed once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::util::error::Error;
use crate::util::json::{self, Json};
use crate::util::sha256;
use crate::util::timefmt;

pub const MANIFEST_NAME: &str = "manifest.json";
pub const MAX_CLOCK_SKEW_S: f64 = 300.0;

/// A file as read and hashed once.
#[derive(Clone, Debug)]
pub struct FileData {
    pub bytes: Arc<Vec<u8>>,
    pub sha256: String,
}

/// Reads files under one root, each once; paths are POSIX, relative to the root.
pub struct Store {
    pub root: PathBuf,
    root_real: PathBuf,
    cache: HashMap<String, FileData>,
}

impl Store {
    pub fn new(root: &Path) -> Result<Store, Error> {
        if !root.is_dir() {
            return Err(Error::new("missing_artifact", format!("{} is not a folder", root.display())));
        }
        let root_real = root
            .canonicalize()
            .map_err(|e| Error::new("unreadable", format!("{}: {e}", root.display())))?;
        Ok(Store { root: root.to_path_buf(), root_real, cache: HashMap::new() })
    }

    /// The bytes and sha256 of `rel` (checked to stay inside the root), read once.
    pub fn file(&mut self, rel: &str) -> Result<FileData, Error> {
        if let Some(f) = self.cache.get(rel) {
            return Ok(f.clone());
        }
        let path = self.resolve_inside(rel)?;
        let meta = std::fs::metadata(&path)
            .map_err(|_| Error::new("missing_file", format!("listed file {rel:?} is missing")))?;
        if !meta.is_file() {
            return Err(Error::new("not_a_file", format!("{rel:?} is not a regular file")));
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::new("not_a_file", format!("cannot read {rel:?}: {e}")))?;
        let f = FileData { sha256: sha256::sha256_hex(&bytes), bytes: Arc::new(bytes) };
        self.cache.insert(rel.to_string(), f.clone());
        Ok(f)
    }

    /// Forget the bytes of files no longer needed (their check is done).
    pub fn drop_bytes(&mut self) {
        self.cache.clear();
    }

    fn resolve_inside(&self, rel: &str) -> Result<PathBuf, Error> {
        let escape = || Error::new("path_escape", format!("path {rel:?} is absolute or leaves the folder"));
        let drive = rel.len() >= 2 && rel.as_bytes()[1] == b':' && rel.as_bytes()[0].is_ascii_alphabetic();
        if rel.is_empty() || rel.contains('\\') || rel.contains('\0') || rel.starts_with('/') || drive
            || rel.split('/').any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(escape());
        }
        let path = self.root.join(rel);
        debug_assert!(Path::new(rel).components().all(|c| matches!(c, Component::Normal(_))));
        if let Ok(real) = path.canonicalize() {
            if !real.starts_with(&self.root_real) {
                return Err(Error::new("path_escape", format!("path {rel:?} resolves outside the folder")));
            }
        }
        Ok(path)
    }
}

/// One files[] entry.
#[derive(Clone, Debug)]
pub struct Entry {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// A verified manifest: its JSON and its files (path -> verified bytes).
pub struct Verified {
    pub json: Json,
    pub entries: Vec<Entry>,
    pub files: BTreeMap<String, FileData>,
}

impl Verified {
    /// The verified bytes of listed file `name` (`not_listed` otherwise).
    pub fn bytes(&self, name: &str) -> Result<Arc<Vec<u8>>, Error> {
        self.files
            .get(name)
            .map(|f| f.bytes.clone())
            .ok_or_else(|| Error::new("not_listed", format!("{name:?} is not listed in the manifest")))
    }
    pub fn content_hash(&self) -> &str {
        self.json.get("content_hash").and_then(Json::as_str).unwrap_or("")
    }
}

const FIELDS: [(&str, char); 14] = [
    ("schema_version", 's'), ("kind", 's'), ("version", 's'), ("content_hash", 's'),
    ("created_at", 's'), ("valid_until", 's'), ("contracts", 'o'), ("features", 'a'),
    ("outputs", 'o'), ("calibration", 'o'), ("training", 'o'), ("runtime", 'o'),
    ("fallback", 'o'), ("files", 'a'),
];

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `"sha256:" + hex(sha256(canonical_json({files, features, outputs, calibration, training})))`:
/// `training` holds the gate's decision, so an edited verdict changes the hash.
pub fn content_hash(manifest: &Json) -> Result<String, Error> {
    let mut body = BTreeMap::new();
    for k in ["files", "features", "outputs", "calibration", "training"] {
        let v = manifest.get(k).ok_or_else(|| Error::new("malformed", format!("missing field {k:?}")))?;
        body.insert(k.to_string(), v.clone());
    }
    let text = json::canonical(&Json::Obj(body)).map_err(|e| Error::new("invalid_json", e))?;
    Ok(format!("sha256:{}", sha256::sha256_hex(text.as_bytes())))
}

/// Verify `<dir>/manifest.json` of the store (dir "" = the root) and every file it lists
/// (paths relative to `dir`). `now`: seconds since the Unix epoch.
pub fn verify(store: &mut Store, dir: &str, required_kind: &str, now: f64) -> Result<Verified, Error> {
    let join = |p: &str| if dir.is_empty() { p.to_string() } else { format!("{dir}/{p}") };
    let raw = std::fs::read(store.root.join(join(MANIFEST_NAME)))
        .map_err(|e| Error::new("unreadable", format!("cannot read {}: {e}", join(MANIFEST_NAME))))?;
    let manifest = json::parse_bytes(&raw)
        .map_err(|e| Error::new("invalid_json", format!("{} is not valid JSON: {e}", join(MANIFEST_NAME))))?;
    if manifest.as_object().is_none() {
        return Err(Error::new("invalid_json", "manifest is not a JSON object"));
    }
    if manifest.get("schema_version").and_then(Json::as_str) != Some("1") {
        return Err(Error::new("schema_version", format!("unsupported schema_version {:?}", manifest.get("schema_version"))));
    }
    for (field, typ) in FIELDS {
        let v = manifest.get(field).ok_or_else(|| Error::new("malformed", format!("missing field {field:?}")))?;
        let ok = match typ {
            's' => v.as_str().is_some(),
            'o' => v.as_object().is_some(),
            _ => v.as_array().is_some(),
        };
        if !ok {
            return Err(Error::new("malformed", format!("field {field:?} has the wrong type")));
        }
    }
    if let Some(sig) = manifest.get("signature") {
        if sig.as_str().is_none() {
            return Err(Error::new("malformed", "signature is not a string"));
        }
    }
    let mut entries = Vec::new();
    for e in manifest.get("files").and_then(Json::as_array).expect("checked") {
        let path = e.get("path").and_then(Json::as_str);
        let sha = e.get("sha256").and_then(Json::as_str).filter(|s| is_hex64(s));
        let size = e.get("size").and_then(Json::as_i64).filter(|s| *s >= 0);
        let (Some(path), Some(sha), Some(size)) = (path, sha, size) else {
            return Err(Error::new("malformed", format!("bad files entry {}", json::canonical(e).unwrap_or_default())));
        };
        if entries.iter().any(|x: &Entry| x.path == path) {
            return Err(Error::new("malformed", format!("duplicate path {path:?}")));
        }
        entries.push(Entry { path: path.to_string(), sha256: sha.to_string(), size: size as u64 });
    }
    let kind = manifest.get("kind").and_then(Json::as_str).expect("checked");
    if kind != required_kind {
        return Err(Error::new("kind", format!("kind {kind:?}, expected {required_kind:?}")));
    }
    let listed = manifest.get("content_hash").and_then(Json::as_str).expect("checked");
    if content_hash(&manifest)? != listed {
        return Err(Error::new("content_hash", format!("{}: content_hash does not match the manifest body", join(MANIFEST_NAME))));
    }
    let created = timefmt::parse_iso(manifest.get("created_at").and_then(Json::as_str).expect("checked"), "created_at")?;
    let until = timefmt::parse_iso(manifest.get("valid_until").and_then(Json::as_str).expect("checked"), "valid_until")?;
    if created > now + MAX_CLOCK_SKEW_S {
        return Err(Error::new("future_created", "created_at is in the future"));
    }
    if now > until {
        return Err(Error::new("expired", format!("artifact expired at {}", manifest.get("valid_until").and_then(Json::as_str).unwrap_or(""))));
    }
    let mut files = BTreeMap::new();
    for e in &entries {
        let f = store.file(&join(&e.path))?;
        if f.bytes.len() as u64 != e.size {
            return Err(Error::new("size_mismatch", format!("{:?}: size {}, listed {}", join(&e.path), f.bytes.len(), e.size)));
        }
        if f.sha256 != e.sha256 {
            return Err(Error::new("hash_mismatch", format!("{:?}: sha256 differs", join(&e.path))));
        }
        files.insert(e.path.clone(), f);
    }
    Ok(Verified { json: manifest, entries, files })
}

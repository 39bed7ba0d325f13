//! Reading a verified artifact folder, whatever its kind: the manifest checks (schema 1,
//! docs/specs/artifacts.md) and the safetensors files the exporters write. The demand and
//! router scorers load through these.

pub mod manifest;
pub mod safetensors;

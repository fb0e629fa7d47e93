//! The in-toto statement that a model signature signs (`spec/model_signing.md` §5): one
//! subject (the folder name and the root digest) and the `https://model_signing/signature/v1.0`
//! predicate (the "files" serialisation and one sha256 resource per file).
//!
//! Owns: building the statement from a sorted resource list (compact JSON, fixed key order,
//! so the same folder gives the same bytes), parsing a signed statement with every check of
//! the reference verifier (§8 steps 4-9), resource-name normalisation and the root digest.
//! Does not own: which files are listed (`folder`) or the envelope (`bundle`).

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::io::digest::hex;

/// `_type` of an in-toto statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of OMS signatures v1.0.
pub const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";

/// One signed file: its `/`-separated relative name and sha256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Path relative to the model folder.
    pub name: String,
    /// Raw sha256.
    pub digest: [u8; 32],
}

/// The root digest: sha256 over the raw resource digests, in the listed order.
pub fn root_digest(resources: &[Resource]) -> [u8; 32] {
    let mut h = Sha256::new();
    for r in resources {
        h.update(r.digest);
    }
    h.finalize().into()
}

#[derive(Serialize)]
struct Statement<'a> {
    #[serde(rename = "_type")]
    ty: &'a str,
    subject: [Subject<'a>; 1],
    #[serde(rename = "predicateType")]
    predicate_type: &'a str,
    predicate: Predicate<'a>,
}

#[derive(Serialize)]
struct Subject<'a> {
    name: &'a str,
    digest: SubjectDigest,
}

#[derive(Serialize)]
struct SubjectDigest {
    sha256: String,
}

#[derive(Serialize)]
struct Predicate<'a> {
    serialization: Serialization<'a>,
    resources: Vec<ResourceOut<'a>>,
}

#[derive(Serialize)]
struct Serialization<'a> {
    method: &'a str,
    hash_type: &'a str,
    allow_symlinks: bool,
    ignore_paths: &'a [String],
}

#[derive(Serialize)]
struct ResourceOut<'a> {
    name: &'a str,
    algorithm: &'a str,
    digest: String,
}

/// The statement bytes for `resources` (already in component order), the folder's name and
/// the ignore paths the signer used.
pub fn build(model_name: &str, resources: &[Resource], ignore_paths: &[String]) -> Vec<u8> {
    let st = Statement {
        ty: STATEMENT_TYPE,
        subject: [Subject {
            name: model_name,
            digest: SubjectDigest {
                sha256: hex(&root_digest(resources)),
            },
        }],
        predicate_type: PREDICATE_TYPE,
        predicate: Predicate {
            serialization: Serialization {
                method: "files",
                hash_type: "sha256",
                allow_symlinks: false,
                ignore_paths,
            },
            resources: resources
                .iter()
                .map(|r| ResourceOut {
                    name: &r.name,
                    algorithm: "sha256",
                    digest: hex(&r.digest),
                })
                .collect(),
        },
    };
    serde_json::to_vec(&st).unwrap_or_default()
}

/// What a verified statement says.
#[derive(Debug)]
pub struct Signed {
    /// `subject[0].name` (informative only).
    pub model_name: String,
    /// Resource name (normalised) → raw sha256.
    pub resources: BTreeMap<String, [u8; 32]>,
    /// `predicate.serialization.ignore_paths`, as written.
    pub ignore_paths: Vec<String>,
}

/// Normalises a resource name as Python's `PurePosixPath` does: `//` and `/./` collapse, a
/// leading `./` goes, `..` stays.
pub fn normalise_name(name: &str) -> String {
    let parts: Vec<&str> = name
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        let lead = if name.starts_with('/') { "/" } else { "" };
        format!("{lead}{}", parts.join("/"))
    }
}

fn field<'a>(
    v: &'a serde_json::Value,
    key: &str,
    at: &str,
) -> Result<&'a serde_json::Value, String> {
    v.get(key)
        .ok_or_else(|| format!("the statement has no `{at}{key}`"))
}

fn string<'a>(v: &'a serde_json::Value, key: &str, at: &str) -> Result<&'a str, String> {
    field(v, key, at)?
        .as_str()
        .ok_or_else(|| format!("`{at}{key}` is not a string"))
}

fn parse_digest(s: &str, at: &str) -> Result<[u8; 32], String> {
    let bad = || format!("`{at}` is not a 64-digit hex sha256: `{s}`");
    if s.len() != 64 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// Parses and checks a statement (payload bytes already covered by a valid signature).
pub fn parse(payload: &[u8]) -> Result<Signed, String> {
    let v: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the signed payload is not JSON: {e}"))?;
    let ty = string(&v, "_type", "")?;
    if ty != STATEMENT_TYPE {
        return Err(format!(
            "statement `_type` is `{ty}`, expected `{STATEMENT_TYPE}`"
        ));
    }
    let pt = string(&v, "predicateType", "")?;
    if pt != PREDICATE_TYPE {
        return Err(format!(
            "`predicateType` is `{pt}`, expected `{PREDICATE_TYPE}` (older v0.2 signatures are not supported)"
        ));
    }
    let subjects = field(&v, "subject", "")?
        .as_array()
        .ok_or("`subject` is not a list")?;
    let [subject] = subjects.as_slice() else {
        return Err(format!(
            "the statement has {} subjects, expected exactly one",
            subjects.len()
        ));
    };
    let model_name = string(subject, "name", "subject[0].")?.to_string();
    let root = string(
        field(subject, "digest", "subject[0].")?,
        "sha256",
        "subject[0].digest.",
    )?;
    let predicate = field(&v, "predicate", "")?;
    let ser = field(predicate, "serialization", "predicate.")?;
    let method = string(ser, "method", "predicate.serialization.")?;
    if method != "files" {
        return Err(format!(
            "serialization method `{method}`; only `files` is supported (as by `model_signing verify`)"
        ));
    }
    string(ser, "hash_type", "predicate.serialization.")?;
    field(ser, "allow_symlinks", "predicate.serialization.")?
        .as_bool()
        .ok_or("`predicate.serialization.allow_symlinks` is not a boolean")?;
    let ignore_paths = match ser.get("ignore_paths") {
        None => Vec::new(),
        Some(list) => list
            .as_array()
            .ok_or("`predicate.serialization.ignore_paths` is not a list")?
            .iter()
            .map(|p| {
                p.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| "an `ignore_paths` entry is not a string".to_string())
            })
            .collect::<Result<_, _>>()?,
    };
    let list = field(predicate, "resources", "predicate.")?
        .as_array()
        .ok_or("`predicate.resources` is not a list")?;
    let mut h = Sha256::new();
    let mut resources = BTreeMap::new();
    for (i, r) in list.iter().enumerate() {
        let at = format!("predicate.resources[{i}].");
        let name = string(r, "name", &at)?;
        let alg = string(r, "algorithm", &at)?;
        if alg != "sha256" {
            return Err(format!(
                "`{at}algorithm` of `{name}` is `{alg}`, expected `sha256`"
            ));
        }
        let d = parse_digest(string(r, "digest", &at)?, &format!("{at}digest"))?;
        h.update(d);
        if resources.insert(normalise_name(name), d).is_some() {
            return Err(format!("resource `{name}` is listed twice"));
        }
    }
    let computed = hex(&h.finalize());
    if computed != root {
        return Err(format!(
            "root digest: the resources give {computed}, the subject says {root}"
        ));
    }
    Ok(Signed {
        model_name,
        resources,
        ignore_paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise_like_pure_posix_path() {
        assert_eq!(normalise_name("./a.txt"), "a.txt");
        assert_eq!(normalise_name("a//b/./c"), "a/b/c");
        assert_eq!(normalise_name("a/../b"), "a/../b");
        assert_eq!(normalise_name("."), ".");
    }

    #[test]
    fn built_statements_parse_back() {
        let rs = vec![
            Resource {
                name: "a/b".into(),
                digest: [1; 32],
            },
            Resource {
                name: "a.b".into(),
                digest: [2; 32],
            },
        ];
        let bytes = build("m", &rs, &[".git".into()]);
        let s = parse(&bytes).unwrap();
        assert_eq!(s.model_name, "m");
        assert_eq!(s.resources.len(), 2);
        assert_eq!(s.ignore_paths, vec![".git".to_string()]);
        let text = String::from_utf8(bytes).unwrap();
        let upper = text.replace(
            &hex(&root_digest(&rs)),
            &hex(&root_digest(&rs)).to_uppercase(),
        );
        assert!(parse(upper.as_bytes()).unwrap_err().contains("root digest"));
    }
}

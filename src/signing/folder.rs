//! Which files of a model folder a signature covers, and their digests
//! (`spec/model_signing.md` §4, "files" serialisation).
//!
//! Owns: the walk (every regular file, hidden ones and empty ones included, directories not
//! listed; a symlink or special file anywhere, even under an ignored path, is an error, as in
//! the reference tool), the ignore rule (component prefixes: the top-level git paths and the
//! signature file), the component-wise order, and the digests (taken from a release manifest
//! that `verify` found valid for the folder, hashed otherwise). Does not own: the statement.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::SignError;
use super::statement::Resource;
use crate::io::digest;
use crate::release::manifest::Manifest;

/// The top-level paths the reference tool ignores by default (`--ignore-git-paths`).
pub const GIT_PATHS: [&str; 4] = [".git", ".gitattributes", ".github", ".gitignore"];

/// True when `name` is `prefix` or lies below it (component-wise).
pub fn is_under(name: &str, prefix: &str) -> bool {
    name == prefix
        || (name.len() > prefix.len()
            && name.starts_with(prefix)
            && name.as_bytes()[prefix.len()] == b'/')
}

/// Every regular file under `dir` as `/`-separated relative names, in component order,
/// leaving out whatever lies under one of `ignored` (relative names).
pub fn walk(dir: &Path, ignored: &[String]) -> Result<Vec<String>, SignError> {
    let meta = fs_err::symlink_metadata(dir).map_err(SignError::io(dir))?;
    if !meta.is_dir() {
        return Err(SignError::Folder {
            path: dir.to_path_buf(),
            problem: "not a directory (wanbake signs release folders)".into(),
        });
    }
    let mut out = Vec::new();
    walk_into(dir, "", ignored, &mut out)?;
    out.sort_by(|a, b| a.split('/').cmp(b.split('/')));
    Ok(out)
}

fn walk_into(
    dir: &Path,
    rel: &str,
    ignored: &[String],
    out: &mut Vec<String>,
) -> Result<(), SignError> {
    let mut entries: Vec<_> = fs_err::read_dir(dir)
        .map_err(SignError::io(dir))?
        .collect::<Result<_, _>>()
        .map_err(SignError::io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            return Err(SignError::Folder {
                path,
                problem: "the file name is not UTF-8, which a signature cannot name".into(),
            });
        };
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let ft = fs_err::symlink_metadata(&path)
            .map_err(SignError::io(&path))?
            .file_type();
        if ft.is_symlink() {
            return Err(SignError::Folder {
                path,
                problem: "is a symbolic link; signed folders may hold only regular files and \
                          directories (copy the target in instead)"
                    .into(),
            });
        }
        if ft.is_dir() {
            walk_into(&path, &child, ignored, out)?;
        } else if ft.is_file() {
            if !ignored.iter().any(|i| is_under(&child, i)) {
                out.push(child);
            }
        } else {
            return Err(SignError::Folder {
                path,
                problem: "is neither a regular file nor a directory (FIFO, socket or device)"
                    .into(),
            });
        }
    }
    Ok(())
}

/// The ignore list a signer or verifier always uses: the git paths and, when it lies inside
/// `dir`, the signature file. Also returns the signature's relative name, if inside.
pub fn base_ignores(
    dir: &Path,
    signature: &Path,
) -> Result<(Vec<String>, Option<String>), SignError> {
    let mut ignored: Vec<String> = GIT_PATHS.iter().map(|s| s.to_string()).collect();
    let rel = relative_inside(dir, signature)?;
    if let Some(r) = &rel {
        ignored.push(r.clone());
    }
    ignored.sort();
    Ok((ignored, rel))
}

/// `signature` relative to `dir` when it lies inside it (both resolved; the signature file
/// need not exist yet).
fn relative_inside(dir: &Path, signature: &Path) -> Result<Option<String>, SignError> {
    let dir = fs_err::canonicalize(dir).map_err(SignError::io(dir))?;
    let name = signature.file_name().ok_or_else(|| SignError::Folder {
        path: signature.to_path_buf(),
        problem: "the signature path names no file".into(),
    })?;
    let parent = match signature.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = fs_err::canonicalize(&parent).map_err(SignError::io(&parent))?;
    let full = parent.join(name);
    let Ok(rel) = full.strip_prefix(&dir) else {
        return Ok(None);
    };
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    Ok(parts.map(|p| p.join("/")))
}

/// The digests of `names` under `dir`: from `manifest` where it lists the file (the caller
/// guarantees it was just verified against the folder), otherwise by hashing.
pub fn resources(
    dir: &Path,
    names: &[String],
    manifest: Option<&Manifest>,
) -> Result<Vec<Resource>, SignError> {
    use rayon::prelude::*;
    let known: BTreeMap<&str, &str> = manifest
        .map(|m| {
            m.files
                .iter()
                .map(|f| (f.path.as_str(), f.sha256.as_str()))
                .collect()
        })
        .unwrap_or_default();
    names
        .par_iter()
        .map(|name| {
            let hex = match known.get(name.as_str()) {
                Some(h) => h.to_string(),
                None => {
                    let path = dir.join(name);
                    digest::sha256_file(&path)?.1
                }
            };
            let mut d = [0u8; 32];
            for (i, o) in d.iter_mut().enumerate() {
                *o = hex
                    .get(2 * i..2 * i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
                    .ok_or_else(|| SignError::BadDigest {
                        file: name.clone(),
                        hex: hex.clone(),
                    })?;
            }
            Ok(Resource {
                name: name.clone(),
                digest: d,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_component_wise() {
        assert!(is_under(".git/objects/x", ".git"));
        assert!(is_under(".github", ".github"));
        assert!(!is_under(".github-old/x", ".github"));
        assert!(!is_under(".gitx", ".git"));
    }

    #[test]
    fn order_is_by_components() {
        let mut v = vec!["a.b", "a/b", "Z", "a-b", "B/x"];
        v.sort_by(|a, b| a.split('/').cmp(b.split('/')));
        assert_eq!(v, vec!["B/x", "Z", "a/b", "a-b", "a.b"]);
    }
}

//! Content-addressed cache of LoRA-XS SVD bases (`--svd-cache DIR`).
//!
//! Owns: the cache key ([`basis_key`]), the entry format, validation of entries read back and
//! their atomic writing, and [`SvdCache::get_or_compute`]. Does not own: computing the bases
//! ([`super::svd`]).
//!
//! Key: sha256 over a domain tag, [`SVD_BASIS_VERSION`], the engine's id ([`SvdEngine::id`]:
//! faer and its version, or cuSOLVER's version, GPU architecture and SM count), the base
//! tensor's dtype string, its original shape, the rank r and its original bytes, each
//! length-prefixed (u64 LE), so no two different inputs share a byte stream. Two tensors with
//! the same bytes share one entry per engine; bases one engine computed are never read by a
//! run of another, so a route's bytes never depend on which route filled the cache first.
//!
//! Entry: `DIR/<64 hex key>.safetensors` with tensors `U` F32 (out, r), `V` F32 (in', r) and
//! `S` F64 (min(out, in'); diagnostics), and `__metadata__` holding `format`, `version`,
//! `engine`, `key`, `base_dtype`, `base_shape`, `rank` and `data_sha256` (sha256 of the data
//! section).
//! It is written to a temporary file in DIR, fsynced, renamed over the final name and the
//! directory fsynced, so a reader sees either the old entry, the new one, or none.
//!
//! An entry that cannot be parsed, is truncated, disagrees with the key fields, has a wrong
//! tensor name, dtype or shape, or whose data does not match `data_sha256` is reported in
//! [`CacheOutcome::Replaced`] (never a panic), recomputed and rewritten.

#![allow(non_snake_case)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use faer::Par;
use sha2::{Digest, Sha256};

use super::engine::SvdEngine;
use super::svd::{LinalgError, XsBases, check_rank, xs_bases};
use crate::format::header_layout::{HeaderLayout, LayoutError, PlannedTensor};
use crate::io::DType;
use crate::io::SafetensorsFile;
use crate::io::TensorView;
use crate::release::staging::{WriteError, replace_file_durable};

/// Version of everything that decides the bits of a basis besides its engine (which the key
/// names separately): the f64 SVD of the f32-widened weight, SA3's sign convention, the
/// truncation, one f32 rounding, and the entry format. Bump it whenever any of these
/// changes, so stale entries are never read. 2: the engine joined the key and the entry.
pub const SVD_BASIS_VERSION: u32 = 2;

/// `format` value in every entry's metadata.
pub const ENTRY_FORMAT: &str = "wanbake.svd-basis";

/// A cache key: sha256 of the base tensor's content, its dtype and shape, the rank and
/// [`SVD_BASIS_VERSION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BasisKey(pub [u8; 32]);

impl BasisKey {
    /// Lowercase hex (64 characters), the entry's file stem.
    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl std::fmt::Display for BasisKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

/// The cache key of the rank-`rank` bases `engine` computes of a base tensor with this
/// dtype, original shape (before the Conv1d (out, in·k) view) and raw bytes.
pub fn basis_key(
    engine: &SvdEngine,
    dtype: DType,
    shape: &[usize],
    bytes: &[u8],
    rank: usize,
) -> BasisKey {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(ENTRY_FORMAT.as_bytes());
    field(&SVD_BASIS_VERSION.to_le_bytes());
    field(engine.id().as_bytes());
    field(dtype.as_str().as_bytes());
    let dims: Vec<u8> = shape
        .iter()
        .flat_map(|&d| (d as u64).to_le_bytes())
        .collect();
    field(&dims);
    field(&(rank as u64).to_le_bytes());
    field(bytes);
    BasisKey(h.finalize().into())
}

/// What [`SvdCache::get_or_compute`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// A valid entry was read.
    Hit,
    /// No entry existed; the bases were computed and stored.
    Miss,
    /// An entry existed but was rejected for `problem`; the bases were recomputed and the
    /// entry rewritten.
    Replaced {
        /// Why the old entry was rejected.
        problem: CacheProblem,
    },
}

/// Why an existing entry was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheProblem {
    /// Not a valid safetensors file (truncated, garbage, ...).
    #[error("{}: unreadable: {reason}", path.display())]
    Unreadable {
        /// The entry.
        path: PathBuf,
        /// The reader's error.
        reason: String,
    },
    /// A metadata field disagrees with the key fields.
    #[error("{}: metadata `{field}`: expected {expected:?}, found {found:?}", path.display())]
    Metadata {
        /// The entry.
        path: PathBuf,
        /// The field.
        field: String,
        /// What the key says.
        expected: String,
        /// What the entry says (`<missing>` if absent).
        found: String,
    },
    /// A tensor is missing or has the wrong dtype or shape, or an extra tensor exists.
    #[error("{}: tensor `{tensor}`: expected {expected}, found {found}", path.display())]
    Tensor {
        /// The entry.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Expected dtype and shape.
        expected: String,
        /// Found dtype and shape (or `missing`).
        found: String,
    },
    /// The data section does not hash to `data_sha256`.
    #[error("{}: data sha256 {found} does not match the recorded {expected}", path.display())]
    Checksum {
        /// The entry.
        path: PathBuf,
        /// Recorded in the metadata.
        expected: String,
        /// Computed from the data.
        found: String,
    },
}

/// Why bases could neither be read from nor stored in the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The OS refused (cache directory missing, not writable, disk full, ...).
    #[error("SVD cache: {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The base tensor cannot have LoRA-XS bases.
    #[error("base tensor `{tensor}`: {reason}")]
    Base {
        /// Tensor name.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// The entry's header could not be laid out (sizes overflow).
    #[error("SVD cache: {}", path.display())]
    Layout {
        /// The entry.
        path: PathBuf,
        /// The layout failure.
        #[source]
        source: LayoutError,
    },
    /// The SVD failed or the rank does not fit.
    #[error("base tensor `{tensor}`")]
    Linalg {
        /// Tensor name.
        tensor: String,
        /// The failure.
        #[source]
        source: LinalgError,
    },
}

/// Bases with the cache's account of where they came from.
#[derive(Clone, Debug)]
pub struct CachedBases {
    /// The bases.
    pub bases: XsBases,
    /// Their key.
    pub key: BasisKey,
    /// Hit, miss or replaced entry.
    pub outcome: CacheOutcome,
}

/// A cache directory.
#[derive(Clone, Debug)]
pub struct SvdCache {
    dir: PathBuf,
}

impl SvdCache {
    /// Uses `dir`, created (with its parents) when missing: what `--svd-cache` and a
    /// recipe's `[merge] svd_cache` name. A path that exists and is not a directory fails.
    pub fn create(dir: &Path) -> Result<SvdCache, CacheError> {
        fs_err::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        SvdCache::open(dir)
    }

    /// Uses `dir`, which must exist and be a directory.
    pub fn open(dir: &Path) -> Result<SvdCache, CacheError> {
        let meta = fs_err::metadata(dir).map_err(|e| io_error(dir, e))?;
        if !meta.is_dir() {
            return Err(io_error(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        Ok(SvdCache {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry for `key` lives.
    pub fn entry_path(&self, key: &BasisKey) -> PathBuf {
        self.dir.join(format!("{}.safetensors", key.hex()))
    }

    /// Returns the rank-`rank` LoRA-XS bases of `base` (any float dtype, 2-D (out, in) or
    /// Conv1d (out, in, k) viewed as (out, in·k)), from the cache when a valid entry of
    /// [`SvdEngine::Faer`] exists, otherwise computed with [`xs_bases`] and stored. A rejected
    /// entry is reported in the outcome and replaced.
    pub fn get_or_compute(
        &self,
        base: &TensorView<'_>,
        rank: usize,
        par: Par,
    ) -> Result<CachedBases, CacheError> {
        self.get_or_compute_with(base, rank, &SvdEngine::Faer, |W, out, inp| {
            xs_bases(W, out, inp, rank, par).map_err(|source| CacheError::Linalg {
                tensor: base.name.to_string(),
                source,
            })
        })
    }

    /// [`SvdCache::get_or_compute`] for the bases of `engine`, a miss computed by
    /// `compute(W, out, in)` (`W` the f32 (out, in) matrix), which must be that engine's SVD:
    /// the entry is keyed and labelled by `engine`.
    pub fn get_or_compute_with<E: From<CacheError>>(
        &self,
        base: &TensorView<'_>,
        rank: usize,
        engine: &SvdEngine,
        compute: impl FnOnce(&[f32], usize, usize) -> Result<XsBases, E>,
    ) -> Result<CachedBases, E> {
        let (out, inp) = matrix_shape(base)?;
        check_rank(rank, out, inp).map_err(|source| CacheError::Linalg {
            tensor: base.name.to_string(),
            source,
        })?;
        let key = basis_key(engine, base.dtype, base.shape, base.bytes, rank);
        let expected = Expected {
            engine,
            key,
            dtype: base.dtype,
            shape: base.shape,
            out,
            inp,
            rank,
        };
        let path = self.entry_path(&key);
        let outcome = match self.load(&path, &expected) {
            Ok(Some(bases)) => {
                return Ok(CachedBases {
                    bases,
                    key,
                    outcome: CacheOutcome::Hit,
                });
            }
            Ok(None) => CacheOutcome::Miss,
            Err(problem) => CacheOutcome::Replaced { problem },
        };
        let W = base.to_f32().map_err(|e| CacheError::Base {
            tensor: base.name.to_string(),
            reason: e.to_string(),
        })?;
        let bases = compute(&W, out, inp)?;
        self.store(&path, &expected, &bases)?;
        Ok(CachedBases {
            bases,
            key,
            outcome,
        })
    }

    /// Reads and validates the entry at `path`: `Ok(None)` if absent, `Err` if rejected.
    fn load(&self, path: &Path, expected: &Expected<'_>) -> Result<Option<XsBases>, CacheProblem> {
        if !path.exists() {
            return Ok(None);
        }
        let file = SafetensorsFile::open(path).map_err(|e| CacheProblem::Unreadable {
            path: path.to_path_buf(),
            reason: crate::error_text::chain(&e),
        })?;
        check_metadata(path, file.metadata(), &expected.metadata(None))?;
        check_tensors(path, &file, expected)?;
        let data = &file.bytes()[file.header().data_start..];
        let found = to_hex(&Sha256::digest(data));
        let recorded = file
            .metadata()
            .get("data_sha256")
            .cloned()
            .unwrap_or_default();
        if found != recorded {
            return Err(CacheProblem::Checksum {
                path: path.to_path_buf(),
                expected: recorded,
                found,
            });
        }
        let bytes = |name: &str| file.view(name).map(|v| v.bytes).unwrap_or_default();
        Ok(Some(XsBases {
            out: expected.out,
            inp: expected.inp,
            rank: expected.rank,
            U: f32_from_le(bytes("U")),
            V: f32_from_le(bytes("V")),
            singular_values: bytes("S")
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        }))
    }

    /// Writes the entry atomically (`release::staging::replace_file_durable`: temp file in the
    /// cache dir, fsync, rename, fsync dir).
    fn store(
        &self,
        path: &Path,
        expected: &Expected<'_>,
        bases: &XsBases,
    ) -> Result<(), CacheError> {
        let bytes = entry_bytes(expected, bases).map_err(|source| CacheError::Layout {
            path: path.to_path_buf(),
            source,
        })?;
        replace_file_durable(path, &bytes).map_err(|e| match e {
            WriteError::Io { path, source } => CacheError::Io { path, source },
            other => io_error(path, std::io::Error::other(other.to_string())),
        })
    }
}

/// What an entry must say.
struct Expected<'a> {
    engine: &'a SvdEngine,
    key: BasisKey,
    dtype: DType,
    shape: &'a [usize],
    out: usize,
    inp: usize,
    rank: usize,
}

impl Expected<'_> {
    /// The metadata fields (all but `data_sha256` unless given).
    fn metadata(&self, data_sha256: Option<String>) -> BTreeMap<String, String> {
        let shape: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let mut m = BTreeMap::from([
            ("format".to_string(), ENTRY_FORMAT.to_string()),
            ("version".to_string(), SVD_BASIS_VERSION.to_string()),
            ("engine".to_string(), self.engine.id()),
            ("key".to_string(), self.key.hex()),
            ("base_dtype".to_string(), self.dtype.as_str().to_string()),
            ("base_shape".to_string(), format!("[{}]", shape.join(","))),
            ("rank".to_string(), self.rank.to_string()),
        ]);
        if let Some(h) = data_sha256 {
            m.insert("data_sha256".to_string(), h);
        }
        m
    }

    /// The tensors an entry holds, as the writer plans them.
    fn planned(&self) -> [PlannedTensor; 3] {
        let t = |name: &str, dtype, shape: Vec<usize>| PlannedTensor {
            name: name.to_string(),
            dtype,
            shape,
        };
        [
            t("S", DType::F64, vec![self.out.min(self.inp)]),
            t("U", DType::F32, vec![self.out, self.rank]),
            t("V", DType::F32, vec![self.inp, self.rank]),
        ]
    }
}

/// (out, in') of a base weight: 2-D as is, N-D (Conv) flattened after the first axis.
fn matrix_shape(base: &TensorView<'_>) -> Result<(usize, usize), CacheError> {
    match base.shape {
        [out, rest @ ..] if !rest.is_empty() => Ok((*out, rest.iter().product())),
        _ => Err(CacheError::Base {
            tensor: base.name.to_string(),
            reason: format!(
                "LoRA-XS needs a 2-D (out, in) or Conv (out, in, k) weight, found shape {:?}",
                base.shape
            ),
        }),
    }
}

fn check_metadata(
    path: &Path,
    found: &BTreeMap<String, String>,
    expected: &BTreeMap<String, String>,
) -> Result<(), CacheProblem> {
    for (field, want) in expected {
        let got = found.get(field);
        if got != Some(want) {
            return Err(CacheProblem::Metadata {
                path: path.to_path_buf(),
                field: field.clone(),
                expected: want.clone(),
                found: got.cloned().unwrap_or_else(|| "<missing>".into()),
            });
        }
    }
    Ok(())
}

fn check_tensors(
    path: &Path,
    file: &SafetensorsFile,
    expected: &Expected<'_>,
) -> Result<(), CacheProblem> {
    let planned = expected.planned();
    let problem = |tensor: &str, expected: String, found: String| CacheProblem::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        expected,
        found,
    };
    for p in &planned {
        let want = format!("{} {:?}", p.dtype.as_str(), p.shape);
        match file.view(&p.name) {
            None => return Err(problem(&p.name, want, "missing".into())),
            Some(v) if v.dtype != p.dtype || v.shape != p.shape.as_slice() => {
                return Err(problem(
                    &p.name,
                    want,
                    format!("{} {:?}", v.dtype.as_str(), v.shape),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = file
        .infos()
        .iter()
        .find(|t| !planned.iter().any(|p| p.name == t.name))
    {
        return Err(problem(
            &extra.name,
            "no such tensor".into(),
            "present".into(),
        ));
    }
    Ok(())
}

/// The complete bytes of an entry.
fn entry_bytes(expected: &Expected<'_>, bases: &XsBases) -> Result<Vec<u8>, LayoutError> {
    let planned = expected.planned();
    let data_of = |name: &str| -> Vec<u8> {
        match name {
            "S" => bases
                .singular_values
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            "U" => bases.U.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => bases.V.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    };
    // The data order depends only on the tensors, not on the metadata, so lay out once to
    // learn the order, hash the data, then lay out again with the hash in the metadata.
    let order = HeaderLayout::build(&planned, &expected.metadata(None))?;
    let mut data = Vec::with_capacity(order.data_len);
    for t in &order.tensors {
        data.extend_from_slice(&data_of(&t.name));
    }
    let metadata = expected.metadata(Some(to_hex(&Sha256::digest(&data))));
    let layout = HeaderLayout::build(&planned, &metadata)?;
    debug_assert_eq!(layout.data_len, data.len());
    let mut bytes = layout.prefix;
    bytes.extend_from_slice(&data);
    Ok(bytes)
}

fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn io_error(path: &Path, e: std::io::Error) -> CacheError {
    CacheError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

//! Recipes: the TOML file a release pipeline checks in, parsed into a validated plan input.
//!
//! Owns: the recipe schema (`Recipe`, every field documented in README.md), strict parsing
//! (unknown fields are errors, naming the field and the file), resolution of relative paths
//! against the recipe's folder (and of Hugging Face cache references, `io::hub`), reading `[merge]` into merge options and `[output]` into
//! output options (`Recipe::merge_options`, `Recipe::output_options`: each field through its
//! type's `FromStr`, then the builder the command line uses, `OutputOptions::new`; errors
//! name the recipe field), and the normalised
//! form recorded in the manifest and in every output file's `__metadata__` (so the same
//! recipe spelled differently records the same thing). Does not own: the names of option
//! values (each type's table, `names`) or executing the bake (`bake`).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::layout::{KeepF32, OutputDType};
use crate::merge::MergeOptions;
use crate::pipeline::{OutputChoices, OutputOptions};

/// A parsed recipe with paths resolved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recipe {
    /// The recipe file.
    #[serde(skip)]
    pub file: PathBuf,
    /// Folder relative paths resolve against.
    #[serde(skip)]
    pub root: PathBuf,
    /// The base checkpoint.
    pub base: BaseSpec,
    /// Adapters, in application order.
    pub adapters: Vec<RecipeAdapter>,
    /// The output (of a release matrix, its first; every one is baked as the recipe with
    /// it alone: [`Recipe::alone`]).
    pub output: OutputSpec,
    /// A release matrix (`[[output]]` tables, two or more): every output, in order; empty
    /// for one `[output]`.
    #[serde(skip)]
    pub matrix: Vec<OutputSpec>,
    /// Merge options.
    pub merge: MergeSpec,
    /// Post-write checks.
    pub checks: Vec<CheckSpec>,
    /// `[sign]`: sign the release before it is committed. Never serialised: the private
    /// key's path appears in no output (the manifest records the public key's hint).
    #[serde(skip)]
    pub sign: Option<SignSpec>,
}

/// `[sign]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignSpec {
    /// ECDSA private key (PEM, PKCS#8 or SEC1), resolved against the recipe's folder.
    pub key: PathBuf,
}

/// `[base]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseSpec {
    /// File or folder.
    pub path: PathBuf,
    /// Expected sha256: a hex string for a single file, or a table of relative file path →
    /// hex for a folder (every listed file must match; unlisted files are not checked).
    #[serde(default)]
    pub sha256: Option<Sha256Spec>,
}

/// An expected hash: one file's, or several files' of a folder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Sha256Spec {
    /// The hash of a single file.
    File(String),
    /// Relative path → hash.
    Files(std::collections::BTreeMap<String, String>),
}

/// `[[adapter]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeAdapter {
    /// File or folder.
    pub path: PathBuf,
    /// Application weight a_i (default 1.0; 0 skips the adapter).
    #[serde(default = "one")]
    pub strength: f64,
    /// Wan 2.2 A14B expert this adapter applies to: `transformer` or `transformer_2`.
    #[serde(default)]
    pub expert: Option<String>,
    /// Expected sha256 (as for the base).
    #[serde(default)]
    pub sha256: Option<Sha256Spec>,
    /// Force a convention instead of detecting it (peft, diffusers, comfy, kohya, lycoris, sa3, nnx).
    #[serde(default)]
    pub from: Option<String>,
    /// Scale σ for files that do not carry one (NNX/Qwix without lora_alpha/lora_rank).
    #[serde(default)]
    pub scale: Option<f64>,
}

fn one() -> f64 {
    1.0
}

/// `[output]`, or one `[[output]]` table of a release matrix.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Output directory.
    pub dir: PathBuf,
    /// `bf16`, `f16`, `f32` or `keep` (default `bf16`; with `to`: the high-precision dtype
    /// of fp8-scaled, default f16; of `comfy:*`, default bf16; of `lightx2v:*`, default f32;
    /// not allowed for GGUF, and Orbax's weights_dtype). Read it through
    /// [`OutputSpec::dtype`].
    #[serde(default, rename = "dtype", skip_serializing_if = "Option::is_none")]
    pub dtype_field: Option<String>,
    /// `diffusers`, `wan`, `nnx`, `nnx-scanned`; default: the base's own layout.
    #[serde(default)]
    pub layout: Option<String>,
    /// `diffusers`, `maxdiffusion`, `none`, or `regex:<pattern>`; default per layout.
    #[serde(default)]
    pub keep_f32: Option<String>,
    /// Shard size: bytes as an integer, or a string like "5GB" / "500MB".
    #[serde(default)]
    pub shard_size: Option<ShardSize>,
    /// Replace an existing output directory (default false).
    #[serde(default)]
    pub overwrite: bool,
    /// A quantized output: `fp8-scaled`, `gguf:<type>` (spec quant_formats.md),
    /// `comfy:fp8|nvfp4|mxfp8|int8|int8-convrot` or `lightx2v:int8|fp8` (quant_formats_2026.md), one file
    /// with original-Wan names; or `orbax`: MaxDiffusion's pretrained Orbax cache (`layout`
    /// `nnx-scanned` (default) or `nnx`, `dtype` its weights_dtype, bf16 by default; no
    /// checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// With `to = "gguf:<block type>"`: quantize the F16/BF16 rounding of each weight, as
    /// city96's two-step pipeline does (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub city96_rounding: bool,
    /// Write values the output cannot hold (NaN, ±inf, a finite value beyond its dtype or
    /// format) and list them in the manifest's report, instead of refusing (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_nonfinite: bool,
}

impl OutputSpec {
    /// The `dtype` field as the merge options read it: the default `bf16` without `to`;
    /// with `to`, only what the recipe says (`quant::encode` picks the default).
    pub fn dtype(&self) -> Option<&str> {
        match (&self.dtype_field, &self.to) {
            (Some(d), _) => Some(d),
            (None, None) => Some("bf16"),
            (None, Some(_)) => None,
        }
    }
}

/// A shard size as written in a recipe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ShardSize {
    /// Bytes.
    Bytes(u64),
    /// "5GB", "500MB", "10GiB".
    Text(String),
}

impl ShardSize {
    /// Bytes, or a message saying why the text is not a size.
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            ShardSize::Bytes(b) if *b > 0 => Ok(*b),
            ShardSize::Bytes(_) => Err("shard_size must be positive".into()),
            ShardSize::Text(t) => parse_size(t),
        }
    }
}

/// Parses "5GB", "500MB", "10GiB", "4096" (decimal units are powers of 1000, `i` units of 1024).
pub fn parse_size(t: &str) -> Result<u64, String> {
    let s = t.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{t}` is not a size (try \"5GB\")"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        other => {
            return Err(format!(
                "`{t}`: unknown unit `{other}` (B, KB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let bytes = (n * mult as f64).round();
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("`{t}` is not a positive size"));
    }
    Ok(bytes as u64)
}

/// `[merge]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeSpec {
    /// Content-addressed SVD basis cache for -xs adapters.
    #[serde(default)]
    pub svd_cache: Option<PathBuf>,
    /// Allow adapter keys that bind to nothing (they are listed in the report).
    #[serde(default)]
    pub allow_unmatched: bool,
    /// DoRA strength semantics: `merge` (application weight, default) or `peft`.
    #[serde(default)]
    pub dora_strength: Option<String>,
}

/// `[[check]]`: run the bundled WAN runner on the output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// A name for reports (default `check-N`).
    #[serde(default)]
    pub name: Option<String>,
    /// Runner inputs (safetensors: hidden_states, timestep, encoder_hidden_states, ...).
    pub inputs: PathBuf,
    /// Expected output file (`noise_pred` or `latents`), or the string "unmerged" to compare
    /// with the base checkpoint run with the same adapters applied at run time, unrounded.
    pub expected: String,
    /// Largest allowed max-abs difference.
    pub tolerance: f64,
    /// Sampling steps (0 = one conditional forward).
    #[serde(default)]
    pub steps: usize,
    /// Flow shift for sampling.
    #[serde(default)]
    pub shift: Option<f64>,
    /// Guidance scale.
    #[serde(default)]
    pub guidance: Option<f64>,
    /// Guidance for the low-noise expert (A14B).
    #[serde(default)]
    pub guidance_2: Option<f64>,
    /// Expert switch (A14B).
    #[serde(default)]
    pub boundary_ratio: Option<f64>,
}

/// The file as written (before path resolution).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecipe {
    base: BaseSpec,
    #[serde(default, rename = "adapter")]
    adapters: Vec<RecipeAdapter>,
    output: RawOutputs,
    #[serde(default)]
    merge: MergeSpec,
    #[serde(default, rename = "check")]
    checks: Vec<CheckSpec>,
    #[serde(default)]
    sign: Option<SignSpec>,
}

/// `[output]` (one table) or `[[output]]` (an array of tables: a release matrix), read
/// through toml's own deserializer either way, so an error inside one still names its line.
enum RawOutputs {
    One(OutputSpec),
    Many(Vec<OutputSpec>),
}

impl<'de> Deserialize<'de> for RawOutputs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = RawOutputs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an [output] table or [[output]] tables")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<RawOutputs, A::Error> {
                let d = serde::de::value::MapAccessDeserializer::new(a);
                OutputSpec::deserialize(d).map(RawOutputs::One)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, a: A) -> Result<RawOutputs, A::Error> {
                let d = serde::de::value::SeqAccessDeserializer::new(a);
                Vec::<OutputSpec>::deserialize(d).map(RawOutputs::Many)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Why a recipe was rejected.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// Could not read the file.
    #[error("{}", path.display())]
    Io {
        /// The recipe.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML or not the schema (unknown field, wrong type, missing field).
    #[error("{}: {message}", path.display())]
    Schema {
        /// The recipe.
        path: PathBuf,
        /// toml's message, which names the field, line and column.
        message: String,
    },
    /// A value names something that cannot be used (an output folder that exists, a cache
    /// folder that cannot be opened), and why.
    #[error("{}: {field}", path.display())]
    Unusable {
        /// The recipe.
        path: PathBuf,
        /// The field.
        field: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A value that is not one of the names its field takes (`output.dtype = "fp9"`): the
    /// same mistake as a bad value of the command line's flag, and a usage error like it.
    #[error("{}: {field}: {message}", path.display())]
    UnknownValue {
        /// The recipe.
        path: PathBuf,
        /// The field.
        field: String,
        /// The value as written.
        value: String,
        /// The value and the names the field takes.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{}: {field}: {message}", path.display())]
    Invalid {
        /// The recipe.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl Recipe {
    /// Reads, parses, validates and resolves a recipe file.
    pub fn load(path: &Path) -> Result<Recipe, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecipeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Recipe::parse(&text, path)
    }

    /// Parses recipe text; relative paths resolve against `path`'s folder.
    pub fn parse(text: &str, path: &Path) -> Result<Recipe, RecipeError> {
        let raw: RawRecipe = toml::from_str(text).map_err(|e| RecipeError::Schema {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let root = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let root = if root.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            root
        };
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                root.join(p)
            }
        };
        // A model or adapter: a Hugging Face cache reference or cache repo folder is read
        // from its snapshot (`io::hub`).
        let input = |field: String, p: &Path| {
            let joined = match crate::io::hub::is_reference(p) {
                true => p.to_path_buf(),
                false => resolve(p),
            };
            crate::io::hub::resolve(&joined).map_err(|e| RecipeError::Unusable {
                path: path.to_path_buf(),
                field,
                source: Box::new(e),
            })
        };
        let mut r = Recipe {
            file: path.to_path_buf(),
            root: root.clone(),
            base: BaseSpec {
                path: input("base.path".into(), &raw.base.path)?,
                sha256: raw.base.sha256,
            },
            adapters: raw
                .adapters
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    Ok(RecipeAdapter {
                        path: input(format!("adapter[{i}].path"), &a.path)?,
                        ..a
                    })
                })
                .collect::<Result<_, RecipeError>>()?,
            output: OutputSpec::default(),
            matrix: Vec::new(),
            merge: MergeSpec {
                svd_cache: raw.merge.svd_cache.as_deref().map(resolve),
                ..raw.merge
            },
            checks: raw
                .checks
                .into_iter()
                .map(|c| CheckSpec {
                    inputs: resolve(&c.inputs),
                    expected: if c.expected == "unmerged" {
                        c.expected
                    } else {
                        resolve(Path::new(&c.expected)).display().to_string()
                    },
                    ..c
                })
                .collect(),
            sign: raw.sign.map(|s| SignSpec {
                key: resolve(&s.key),
            }),
        };
        let resolved = |o: OutputSpec| OutputSpec {
            dir: resolve(&o.dir),
            ..o
        };
        match raw.output {
            RawOutputs::One(o) => r.output = resolved(o),
            RawOutputs::Many(many) => {
                r.matrix = many.into_iter().map(resolved).collect();
                match r.matrix.as_slice() {
                    [] => return Err(r.invalid("output", "[[output]] needs at least one table")),
                    // One [[output]] table is the recipe with that [output].
                    [one] => (r.output, r.matrix) = (one.clone(), Vec::new()),
                    [first, ..] => r.output = first.clone(),
                }
            }
        }
        r.validate()?;
        for (i, c) in r.checks.iter_mut().enumerate() {
            c.name.get_or_insert_with(|| format!("check-{}", i + 1));
        }
        Ok(r)
    }

    /// `p` as the recipe spells it: relative to the recipe's folder when inside it, with
    /// `/` separators (an absolute path keeps its one leading `/`).
    pub fn relative(&self, p: &Path) -> String {
        use std::path::Component;
        p.strip_prefix(&self.root)
            .unwrap_or(p)
            .components()
            .map(|c| match c {
                // The root is the empty first part: joined, it gives the one leading `/`
                // (its own text, "/", would give two).
                Component::RootDir => String::new(),
                c => c.as_os_str().to_string_lossy().into_owned(),
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> RecipeError {
        RecipeError::Invalid {
            path: self.file.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn validate(&self) -> Result<(), RecipeError> {
        for (i, a) in self.adapters.iter().enumerate() {
            let f = |n: &str| format!("adapter[{i}].{n}");
            if !a.strength.is_finite() {
                return Err(self.invalid(f("strength"), "must be a finite number"));
            }
            if let Some(e) = &a.expert
                && e != "transformer"
                && e != "transformer_2"
            {
                return Err(self.invalid(
                    f("expert"),
                    format!("`{e}` is not `transformer` or `transformer_2`"),
                ));
            }
            if let Some(s) = a.scale
                && !(s.is_finite())
            {
                return Err(self.invalid(f("scale"), "must be a finite number"));
            }
            check_sha_spec(a.sha256.as_ref()).map_err(|m| self.invalid(f("sha256"), m))?;
        }
        check_sha_spec(self.base.sha256.as_ref()).map_err(|m| self.invalid("base.sha256", m))?;
        self.merge_options()?;
        self.check_matrix()?;
        for (i, r) in self.outputs().iter().enumerate() {
            r.output_options().map_err(|e| match self.is_matrix() {
                true => e.in_matrix(i),
                false => e,
            })?;
        }
        for (i, c) in self.checks.iter().enumerate() {
            if !(c.tolerance.is_finite() && c.tolerance >= 0.0) {
                return Err(self.invalid(
                    format!("check[{i}].tolerance"),
                    "must be a non-negative number",
                ));
            }
        }
        Ok(())
    }

    /// Is this a release matrix (two or more `[[output]]` tables)?
    pub fn is_matrix(&self) -> bool {
        !self.matrix.is_empty()
    }

    /// The recipe of each output baked alone, in order (this recipe itself without a
    /// matrix): the same base, adapters, merge, signing and checks, with that one output
    /// (an Orbax output, which the runner cannot load, without the checks). What each
    /// output of a matrix records (manifest, file metadata) is its recipe alone's, so it is
    /// byte-identical to the same output baked alone.
    pub fn outputs(&self) -> Vec<Recipe> {
        if self.matrix.is_empty() {
            return vec![self.clone()];
        }
        (0..self.matrix.len()).map(|i| self.alone(i)).collect()
    }

    /// The recipe with output `i` of the matrix alone ([`Recipe::outputs`]).
    pub fn alone(&self, i: usize) -> Recipe {
        let output = self
            .matrix
            .get(i)
            .cloned()
            .unwrap_or_else(|| self.output.clone());
        let orbax = output.to.as_deref() == Some("orbax");
        Recipe {
            output,
            matrix: Vec::new(),
            checks: if orbax {
                Vec::new()
            } else {
                self.checks.clone()
            },
            ..self.clone()
        }
    }

    /// A matrix's outputs: each in a folder of its own (not the same, not one inside
    /// another), and the checks run on at least one of them.
    fn check_matrix(&self) -> Result<(), RecipeError> {
        for (i, a) in self.matrix.iter().enumerate() {
            for (j, b) in self.matrix.iter().enumerate().skip(i + 1) {
                if a.dir.starts_with(&b.dir) || b.dir.starts_with(&a.dir) {
                    return Err(self.invalid(
                        format!("output[{j}].dir"),
                        format!(
                            "{} and output[{i}]'s {} overlap: each output needs a folder of its own",
                            self.relative(&b.dir),
                            self.relative(&a.dir)
                        ),
                    ));
                }
            }
        }
        let runnable = self.matrix.iter().any(|o| o.to.as_deref() != Some("orbax"));
        if self.is_matrix() && !self.checks.is_empty() && !runnable {
            return Err(self.invalid(
                "output",
                "every output is an Orbax cache, which the checks' runner cannot load; drop the [[check]] tables or add a safetensors output",
            ));
        }
        Ok(())
    }

    /// `[merge]` as merge options, each field read with its type's `FromStr` (the names the
    /// command line takes); an error names the recipe field (`merge.dora_strength`).
    pub fn merge_options(&self) -> Result<MergeOptions, RecipeError> {
        Ok(MergeOptions {
            dora_strength: recipe_field(
                self,
                "merge.dora_strength",
                self.merge.dora_strength.as_deref(),
            )?
            .unwrap_or_default(),
            allow_unmatched: self.merge.allow_unmatched,
        })
    }

    /// `[output]` as output options: each field read with its type's `FromStr` (the names the
    /// command line takes), then [`OutputOptions::new`], the builder the command line uses
    /// too; an error names the recipe field (`output.dtype`).
    pub fn output_options(&self) -> Result<OutputOptions, RecipeError> {
        let o = &self.output;
        let choices = OutputChoices {
            dtype: recipe_field(self, "output.dtype", o.dtype())?.unwrap_or_default(),
            keep_f32: o
                .keep_f32
                .as_deref()
                .map(KeepF32::parse)
                .transpose()
                .map_err(|e| self.invalid("output.keep_f32", e.to_string()))?,
            layout: recipe_field(self, "output.layout", o.layout.as_deref())?,
            shard_bytes: o
                .shard_size
                .as_ref()
                .map(ShardSize::bytes)
                .transpose()
                .map_err(|m| self.invalid("output.shard_size", m))?,
            to: recipe_field(self, "output.to", o.to.as_deref())?,
            city96_rounding: o.city96_rounding,
            nonfinite: crate::pipeline::NonFinite::allowed(o.allow_nonfinite),
        };
        let options = OutputOptions::new(choices)
            .map_err(|b| self.invalid(format!("output.{}", b.field), b.message))?;
        if options.container == crate::pipeline::Container::Orbax && !self.checks.is_empty() {
            return Err(self.invalid(
                "output.to",
                "orbax: the checks run the bundled runner on safetensors weights, and an Orbax cache has none; drop the [[check]] tables or bake to safetensors",
            ));
        }
        Ok(options)
    }

    /// The normalised recipe recorded in the manifest and in output metadata: paths as the
    /// recipe spells them relative to its folder, defaults filled in, keys sorted.
    pub fn normalised(&self) -> serde_json::Value {
        let rel = |p: &Path| self.relative(p);
        let mut v = serde_json::to_value(self).expect("recipe serialises");
        if let Some(d) = self.output.dtype() {
            // Canonical: an alias (`bfloat16`) records as the name it stands for.
            let d: &str = match d.parse::<OutputDType>() {
                Ok(known) => known.as_str(),
                Err(_) => d,
            };
            v["output"]["dtype"] = d.into();
        }
        v["base"]["path"] = rel(&self.base.path).into();
        for (i, a) in self.adapters.iter().enumerate() {
            v["adapters"][i]["path"] = rel(&a.path).into();
        }
        v["output"]["dir"] = rel(&self.output.dir).into();
        if let Some(c) = &self.merge.svd_cache {
            v["merge"]["svd_cache"] = rel(c).into();
        }
        for (i, c) in self.checks.iter().enumerate() {
            v["checks"][i]["inputs"] = rel(&c.inputs).into();
            if c.expected != "unmerged" {
                v["checks"][i]["expected"] = rel(Path::new(&c.expected)).into();
            }
        }
        if self.is_matrix() {
            let outputs = self.outputs();
            v["output"] = (outputs.iter().map(|r| r.normalised()["output"].clone())).collect();
        }
        // Round-trip through a string so object keys come out sorted.
        serde_json::from_str(&v.to_string()).expect("valid JSON")
    }
}

impl RecipeError {
    /// This error of output `i` of a matrix alone, naming its field as the matrix's
    /// (`output[1].dtype`, not `output.dtype`).
    fn in_matrix(self, i: usize) -> RecipeError {
        let rename = |field: String| match field.strip_prefix("output") {
            Some(rest) => format!("output[{i}]{rest}"),
            None => field,
        };
        match self {
            RecipeError::Invalid {
                path,
                field,
                message,
            } => RecipeError::Invalid {
                path,
                field: rename(field),
                message,
            },
            RecipeError::UnknownValue {
                path,
                field,
                value,
                message,
            } => RecipeError::UnknownValue {
                path,
                field: rename(field),
                value,
                message,
            },
            other => other,
        }
    }
}

/// A recipe field read with its type's `FromStr`; an error names the field.
fn recipe_field<T: FromStr>(
    r: &Recipe,
    name: &str,
    text: Option<&str>,
) -> Result<Option<T>, RecipeError>
where
    T::Err: std::fmt::Display,
{
    text.map(str::parse)
        .transpose()
        .map_err(|e: T::Err| RecipeError::UnknownValue {
            path: r.file.clone(),
            field: name.into(),
            value: text.unwrap_or_default().into(),
            message: e.to_string(),
        })
}

fn check_sha_spec(s: Option<&Sha256Spec>) -> Result<(), String> {
    let ok = |h: &str| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    match s {
        None => Ok(()),
        Some(Sha256Spec::File(h)) if ok(h) => Ok(()),
        Some(Sha256Spec::File(h)) => Err(format!("`{h}` is not 64 lower-case hex digits")),
        Some(Sha256Spec::Files(m)) => match m.iter().find(|(_, h)| !ok(h)) {
            Some((k, h)) => Err(format!("`{k}` = `{h}` is not 64 lower-case hex digits")),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[base]
path = "models/t2v"

[[adapter]]
path = "a.safetensors"
strength = 0.5

[[adapter]]
path = "/abs/b"
expert = "transformer_2"

[output]
dir = "out"
layout = "nnx-scanned"
shard_size = "5GB"

[[check]]
inputs = "in.safetensors"
expected = "unmerged"
tolerance = 0.01
"#;

    #[test]
    fn parses_resolves_and_normalises() {
        let r = Recipe::parse(GOOD, Path::new("recipes/demo.toml")).unwrap();
        assert_eq!(r.base.path, Path::new("recipes/models/t2v"));
        assert_eq!(r.adapters[1].path, Path::new("/abs/b"));
        assert_eq!(r.adapters[1].strength, 1.0);
        assert_eq!(r.output.dtype(), Some("bf16"));
        assert_eq!(
            r.output.shard_size.as_ref().unwrap().bytes().unwrap(),
            5_000_000_000
        );
        assert_eq!(r.checks[0].name.as_deref(), Some("check-1"));
        let n = r.normalised();
        assert_eq!(n["base"]["path"], "models/t2v");
        assert_eq!(n["output"]["dir"], "out");
        // An absolute path outside the recipe's folder keeps its one leading slash.
        assert_eq!(n["adapters"][1]["path"], "/abs/b");
        assert_eq!(r.relative(Path::new("/abs/b")), "/abs/b");
        // Spelling the same recipe differently normalises identically.
        let again = Recipe::parse(
            &GOOD.replace("strength = 0.5", "strength = 5e-1"),
            Path::new("recipes/demo.toml"),
        )
        .unwrap();
        assert_eq!(again.normalised(), n);
    }

    #[test]
    fn unknown_fields_and_bad_values_are_errors_naming_them() {
        let e = Recipe::parse(
            &GOOD.replace("strength = 0.5", "strenght = 0.5"),
            Path::new("r.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("strenght"), "{e}");
        let e = Recipe::parse(&format!("{GOOD}\n[extra]\nx=1\n"), Path::new("r.toml")).unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
        let e = Recipe::parse(
            &GOOD.replace("\"transformer_2\"", "\"transformer_3\""),
            Path::new("r.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("adapter[1].expert"), "{e}");
        let e = Recipe::parse(
            &GOOD.replace("\"5GB\"", "\"5 parsecs\""),
            Path::new("r.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("output.shard_size"), "{e}");
        let e = Recipe::parse(
            &GOOD.replace("[base]\npath", "[base]\nsha256 = \"abc\"\npath"),
            Path::new("r.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("base.sha256"), "{e}");
    }

    #[test]
    fn option_values_are_read_by_their_types_and_errors_name_the_field() {
        let parse = |text: String| Recipe::parse(&text, Path::new("r.toml"));
        for (field, line, section) in [
            ("output.dtype", "dtype = \"bf17\"", "[output]"),
            ("output.layout", "layout = \"scanned\"", "[output]"),
            ("output.keep_f32", "keep_f32 = \"regex:(\"", "[output]"),
            ("output.to", "to = \"GGUF:Q8_0\"", "[output]"),
            (
                "merge.dora_strength",
                "dora_strength = \"inside\"",
                "[merge]",
            ),
        ] {
            let text = if section == "[output]" {
                GOOD.replace("layout = \"nnx-scanned\"", line)
            } else {
                format!("{GOOD}\n[merge]\n{line}\n")
            };
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(&format!("r.toml: {field}: ")), "{e}");
            assert!(!e.contains("--"), "a recipe error names no flag: {e}");
        }
        // One table: a PyTorch alias reads as the name it stands for, and records as it.
        let bf16 = parse(GOOD.replace("shard_size", "dtype = \"bf16\"\nshard_size")).unwrap();
        let alias = parse(GOOD.replace("shard_size", "dtype = \"bfloat16\"\nshard_size")).unwrap();
        assert_eq!(alias.normalised(), bf16.normalised());
        assert_eq!(alias.output_options().unwrap().dtype, OutputDType::BF16);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("0").is_err());
        assert!(parse_size("GB").is_err());
    }
}

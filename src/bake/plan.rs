//! The plan phase of a bake: everything that can be checked before a byte is written.
//!
//! Owns: [`open_bake`] (open the base, bind every adapter to its expert, check the output
//! path, validate every check's files: [`BakeInputs`], what the plan borrows), then
//! [`BakeInputs::plan`] (plan the merge and the output layout, hash every input and compare
//! declared sha256s, measure the free space: a [`BakePlan`], the only value `bake::execute`
//! takes) or [`BakeInputs::dry_run`] (the same, hashing the base only when the recipe
//! declares its sha256: a [`DryRun`], which cannot be executed). Does not own: the plan's
//! own refusals (`pipeline::plan`), the recipe schema (`recipe`), writing (`bake::execute`).

use std::path::{Path, PathBuf};

use super::error::BakeError;
use crate::adapter::Convention;
use crate::release::staging::WriteError;
use crate::release::staging::check_not_input;

use crate::adapter::{AdapterSpec, BoundAdapter, BoundSet, ComponentChoice, bind_specs};
use crate::merge::MergeOptions;
use crate::model::base_model::BaseModel;
use crate::model::fingerprint::Fingerprint;
use crate::pipeline::{OutputOptions, Plan, Ready};
use crate::recipe::{CheckSpec, Recipe, Sha256Spec};
use crate::release::manifest::InputRecord;
use crate::runner::{ModelSet, RunInputs};

/// Free space at the output's file system.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Space {
    /// The directory measured (the output's nearest existing ancestor).
    pub dir: PathBuf,
    /// Bytes the output needs.
    pub needed: u64,
    /// Bytes free there (None: the file system would not say).
    pub available: Option<u64>,
    /// Does it fit (with a 1 MiB margin)?
    pub fits: bool,
}

/// A declared sha256 and what was found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HashCheck {
    /// `base` or `adapter[i]`.
    pub what: String,
    /// The file.
    pub path: String,
    /// Declared.
    pub expected: String,
    /// Found.
    pub found: String,
}

/// What a bake reads, opened, recognised and bound: what its plan borrows.
pub struct BakeInputs {
    /// The recipe.
    pub recipe: Recipe,
    /// The base, opened and recognised.
    pub base: BaseModel,
    /// What the base is.
    pub fingerprints: Vec<(String, Fingerprint)>,
    /// Every adapter bound to its transformer.
    pub adapters: BoundSet,
    /// How to merge (`[merge]`).
    pub merge: MergeOptions,
    /// Every output (`[output]`, or each `[[output]]` of a release matrix), in order.
    pub outputs: Vec<BakeOutput>,
}

/// One output of a bake: the recipe with it alone (what its manifest and files record:
/// `Recipe::alone`) and how it is written.
pub struct BakeOutput {
    /// The recipe with this output alone.
    pub recipe: Recipe,
    /// How to write it (its `[output]`).
    pub options: OutputOptions,
}

/// A planned bake: the merge planned, every input hashed (the manifest and every output
/// header record them), declared hashes matched, the free space measured. Only
/// [`BakeInputs::plan`] makes one. Derefs to what it found.
pub struct BakePlan<'a>(Planned<'a>);

/// A planned dry run: as [`BakePlan`], but the base is hashed only when the recipe declares
/// its sha256, so it cannot be executed. Derefs to what it found.
pub struct DryRun<'a>(Planned<'a>);

/// What the plan phase found.
pub struct Planned<'a> {
    /// The inputs, opened and bound.
    pub inputs: &'a BakeInputs,
    /// Each output's merge plan with the hashed inputs (the same inputs in each), in the
    /// order of `inputs.outputs`.
    pub ready: Vec<Ready<'a>>,
    /// Is the base hashed (always, except in a dry run with no declared sha256)?
    pub base_hashed: bool,
    /// Declared hashes, all matching.
    pub hashes: Vec<HashCheck>,
    /// Free space for each output (an "unmerged" check writes nothing: `bake::reference`);
    /// outputs on one file system must fit there together.
    pub space: Vec<Space>,
}

impl Planned<'_> {
    /// Does every output fit?
    pub fn fits(&self) -> bool {
        self.space.iter().all(|s| s.fits)
    }
}

impl<'a> std::ops::Deref for BakePlan<'a> {
    type Target = Planned<'a>;
    fn deref(&self) -> &Planned<'a> {
        &self.0
    }
}

impl<'a> std::ops::Deref for DryRun<'a> {
    type Target = Planned<'a>;
    fn deref(&self) -> &Planned<'a> {
        &self.0
    }
}

impl<'a> BakePlan<'a> {
    /// What was found, to execute.
    pub(super) fn into_inner(self) -> Planned<'a> {
        self.0
    }
}

/// Opens and binds everything the recipe names, and checks everything that needs no
/// hashing. Nothing is created on disk.
pub fn open_bake(recipe: Recipe) -> Result<BakeInputs, BakeError> {
    let base = crate::quant::base::open(&recipe.base.path)?;
    let fingerprints = base
        .parts()
        .map(|(c, m)| (c.name.clone(), m.fingerprint.clone()))
        .collect();
    let specs = adapter_specs(&recipe)?;
    let merge = recipe.merge_options()?;
    let outputs = (recipe.outputs().into_iter())
        .map(|r| {
            let options = r.output_options()?;
            Ok(BakeOutput { recipe: r, options })
        })
        .collect::<Result<Vec<_>, BakeError>>()?;
    if let Some(dir) = &recipe.merge.svd_cache
        && dir.exists()
        && !dir.is_dir()
    {
        return Err(BakeError::recipe(
            &recipe,
            "merge.svd_cache",
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    for o in &outputs {
        check_output_path(&o.recipe, &base)?;
    }
    let adapters = bind_specs(&specs, &base, merge.allow_unmatched)?;
    for c in &recipe.checks {
        validate_check(&recipe, c)?;
    }
    Ok(BakeInputs {
        recipe,
        base,
        fingerprints,
        adapters,
        merge,
        outputs,
    })
}

impl BakeInputs {
    /// Plans the bake, hashing every input. Nothing is created on disk.
    pub fn plan(&self) -> Result<BakePlan<'_>, BakeError> {
        self.planned(true).map(BakePlan)
    }

    /// Plans a dry run: as [`BakeInputs::plan`], but the base is hashed only when the recipe
    /// declares its sha256 (a dry run of a recipe that pins nothing need not read a 30 GB
    /// base).
    pub fn dry_run(&self) -> Result<DryRun<'_>, BakeError> {
        self.planned(self.recipe.base.sha256.is_some()).map(DryRun)
    }

    fn planned(&self, hash_base: bool) -> Result<Planned<'_>, BakeError> {
        let mut ready: Vec<Ready<'_>> = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let plan = Plan::new(&self.base, &self.adapters, &o.options)?;
            let r = match (ready.first(), hash_base) {
                (Some(first), _) => plan.ready_as(first),
                (None, true) => plan.hash_base("base")?,
                (None, false) => plan.hash_base_while_writing("base"),
            };
            ready.push(r);
            if let [only] = ready.as_mut_slice() {
                relative_input_paths(&mut only.inputs, &self.recipe.root);
            }
        }
        let first = ready
            .first()
            .ok_or_else(|| BakeError::Internal("no output".into()))?;
        let hashes =
            check_declared_hashes(&self.recipe, &self.base, &self.adapters, &first.inputs)?;
        let outputs = (self.outputs.iter().zip(&ready))
            .map(|(o, r)| (o.recipe.output.dir.as_path(), r.output.total_bytes()));
        let space = measure_space(outputs.collect());
        Ok(Planned {
            inputs: self,
            ready,
            base_hashed: hash_base,
            hashes,
            space,
        })
    }
}

/// The recipe's adapters as merge specs (the expert names the component).
fn adapter_specs(recipe: &Recipe) -> Result<Vec<AdapterSpec>, BakeError> {
    recipe
        .adapters
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let from = a
                .from
                .as_deref()
                .map(str::parse::<Convention>)
                .transpose()
                .map_err(|e| {
                    BakeError::recipe(recipe, format!("adapter[{i}].from"), e.to_string())
                })?;
            Ok(AdapterSpec {
                text: format!("adapter[{i}] {}", recipe.relative(&a.path)),
                component: match &a.expert {
                    Some(e) => ComponentChoice::Named(e.clone()),
                    None => ComponentChoice::Only,
                },
                path: a.path.clone(),
                strength: a.strength,
                from,
                scale: a.scale,
            })
        })
        .collect()
}

/// The output must not exist (unless `overwrite`) and must not overlap an input.
fn check_output_path(recipe: &Recipe, base: &BaseModel) -> Result<(), BakeError> {
    let dir = &recipe.output.dir;
    if !recipe.output.overwrite && dir.symlink_metadata().is_ok() {
        let exists = WriteError::Exists { path: dir.clone() };
        return Err(BakeError::unusable(recipe, "output.dir", exists));
    }
    let mut inputs = base.input_files();
    inputs.push(recipe.base.path.clone());
    inputs.extend(recipe.adapters.iter().map(|a| a.path.clone()));
    check_not_input(dir, &inputs).map_err(|e| BakeError::unusable(recipe, "output.dir", e))
}

/// A check's files exist and say what the check needs, and the base is a WAN transformer
/// the runner can load.
fn validate_check(recipe: &Recipe, c: &CheckSpec) -> Result<(), BakeError> {
    let name = c.name.clone().unwrap_or_default();
    let fail = |reason: String| BakeError::CheckSetup {
        check: name.clone(),
        reason,
    };
    ModelSet::open(&recipe.base.path, None)
        .map_err(|e| BakeError::check_input(&c.name, Some("the runner cannot load the base"), e))?;
    RunInputs::read(&c.inputs).map_err(|e| BakeError::check_input(&c.name, None, e))?;
    if c.steps == 0 && c.guidance_2.is_some() {
        return Err(fail(
            "guidance_2 only applies when sampling (steps > 0)".into(),
        ));
    }
    if c.expected != "unmerged" {
        let want = super::check::expected_tensor_name(c.steps);
        let path = Path::new(&c.expected);
        let f = crate::io::SafetensorsFile::open(path)
            .map_err(|e| BakeError::check_input(&c.name, Some("expected output"), e))?;
        if f.position(want).is_none() {
            return Err(fail(format!(
                "{} has no tensor `{want}` (steps = {} produces `{want}`)",
                path.display(),
                c.steps
            )));
        }
    }
    Ok(())
}

/// Input paths as the recipe spells them (relative to its folder), so the record does not
/// depend on the directory the bake was started from.
fn relative_input_paths(inputs: &mut [InputRecord], root: &Path) {
    for r in inputs.iter_mut() {
        if let Ok(rel) = Path::new(&r.path).strip_prefix(root) {
            r.path = slash(rel);
        }
    }
    inputs.sort();
}

fn slash(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Compares every declared sha256 with the hash just computed.
fn check_declared_hashes(
    recipe: &Recipe,
    base: &BaseModel,
    adapters: &[BoundAdapter],
    inputs: &[InputRecord],
) -> Result<Vec<HashCheck>, BakeError> {
    let mut out = Vec::new();
    if let Some(spec) = &recipe.base.sha256 {
        let files = base.input_files();
        out.extend(compare(
            recipe,
            "base",
            &recipe.base.path,
            &files,
            spec,
            inputs,
        )?);
    }
    for (i, a) in recipe.adapters.iter().enumerate() {
        let Some(spec) = &a.sha256 else { continue };
        let mut files: Vec<PathBuf> = adapters
            .iter()
            .filter(|b| b.set.input_files().iter().any(|p| p.starts_with(&a.path)))
            .flat_map(|b| b.set.input_files())
            .collect();
        files.sort();
        files.dedup();
        out.extend(compare(
            recipe,
            &format!("adapter[{i}]"),
            &a.path,
            &files,
            spec,
            inputs,
        )?);
    }
    Ok(out)
}

/// One input's declared hash(es) against the records: a single hash names a single file;
/// a table names files relative to the input folder.
fn compare(
    recipe: &Recipe,
    what: &str,
    path: &Path,
    files: &[PathBuf],
    spec: &Sha256Spec,
    inputs: &[InputRecord],
) -> Result<Vec<HashCheck>, BakeError> {
    let field = format!("{what}.sha256");
    let wanted: Vec<(PathBuf, String)> = match spec {
        Sha256Spec::File(h) if path.is_file() => vec![(path.to_path_buf(), h.clone())],
        Sha256Spec::File(_) => {
            return Err(BakeError::recipe(
                recipe,
                field,
                format!(
                    "{} is a folder; give a table of file = sha256, e.g. \
                     sha256 = {{ \"diffusion_pytorch_model.safetensors\" = \"…\" }}",
                    path.display()
                ),
            ));
        }
        Sha256Spec::Files(m) => m.iter().map(|(k, h)| (path.join(k), h.clone())).collect(),
    };
    let mut out = Vec::new();
    for (file, expected) in wanted {
        if !files.iter().any(|f| f == &file) {
            return Err(BakeError::recipe(
                recipe,
                field,
                format!("{} is not a file this {what} reads", file.display()),
            ));
        }
        let shown = recipe.relative(&file);
        let found = inputs
            .iter()
            .find(|r| r.path == shown || Path::new(&r.path) == file)
            .map(|r| r.sha256.clone())
            .ok_or_else(|| BakeError::Internal(format!("{shown} was not hashed")))?;
        if found != expected {
            return Err(BakeError::HashMismatch {
                what: what.to_string(),
                path: file,
                expected,
                found,
            });
        }
        out.push(HashCheck {
            what: what.to_string(),
            path: shown,
            expected,
            found,
        });
    }
    Ok(out)
}

/// Free space for each output (`dest`, bytes needed) at its nearest existing ancestor; the
/// outputs on one file system must fit there together (a 1 MiB margin each).
fn measure_space(outputs: Vec<(&Path, u64)>) -> Vec<Space> {
    use std::os::unix::fs::MetadataExt;
    let mut spaces: Vec<(Option<u64>, Space)> = Vec::with_capacity(outputs.len());
    for (dest, needed) in outputs {
        let mut dir = dest.parent().map(Path::to_path_buf).unwrap_or_default();
        while !dir.as_os_str().is_empty() && !dir.exists() {
            dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
        }
        if dir.as_os_str().is_empty() {
            dir = PathBuf::from(".");
        }
        let available = rustix::fs::statvfs(&dir)
            .ok()
            .map(|st| st.f_bavail.saturating_mul(st.f_frsize));
        let device = std::fs::metadata(&dir).ok().map(|m| m.dev());
        let space = Space {
            dir,
            needed,
            available,
            fits: true,
        };
        spaces.push((device, space));
    }
    let together = |device: Option<u64>| -> u64 {
        (spaces.iter())
            .filter(|(d, _)| device.is_some() && *d == device)
            .map(|(_, s)| s.needed.saturating_add(1 << 20))
            .sum()
    };
    let fits: Vec<bool> = (spaces.iter())
        .map(|(device, s)| {
            let needed = together(*device).max(s.needed.saturating_add(1 << 20));
            s.available.is_none_or(|a| needed <= a)
        })
        .collect();
    (spaces.into_iter().zip(fits))
        .map(|((_, s), fits)| Space { fits, ..s })
        .collect()
}

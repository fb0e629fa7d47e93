//! Post-write checks: run the bundled WAN runner on the baked output and compare with an
//! expected output.
//!
//! Owns: `CheckOutcome`, running one check (`run_check`) against a golden file or a
//! reference model (the "unmerged" comparison), and the comparison rule (max-abs difference
//! within the tolerance; a NaN anywhere fails). Does not own: the runner (`runner`), the
//! reference model (`bake::reference`).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::error::BakeError;
use crate::recipe::{CheckSpec, Recipe};
use crate::runner::{ModelSet, RunInputs, RunSettings, Tensor, run_models};

/// What a check found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckOutcome {
    /// The check's name.
    pub name: String,
    /// The inputs file (as the recipe spells it).
    pub inputs: String,
    /// The expected file, or `unmerged`.
    pub expected: String,
    /// 0: one forward; N: N sampling steps.
    pub steps: usize,
    /// `noise_pred` or `latents`.
    pub tensor: String,
    /// Shape compared.
    pub shape: Vec<usize>,
    /// Largest |baked − expected| (infinity when a NaN appears).
    pub max_abs_diff: f64,
    /// Mean |baked − expected|.
    pub mean_abs_diff: f64,
    /// Largest |expected|, for scale.
    pub max_abs_expected: f64,
    /// Allowed max-abs difference.
    pub tolerance: f64,
    /// max_abs_diff ≤ tolerance.
    pub passed: bool,
    /// Wall time of the baked run (not serialised: the manifest must not depend on time).
    #[serde(skip)]
    pub seconds: f64,
}

/// The tensor a run with `steps` steps produces.
pub fn expected_tensor_name(steps: usize) -> &'static str {
    if steps == 0 { "noise_pred" } else { "latents" }
}

/// The runner settings of a check (the defaults of `wanbake run`).
pub fn settings(c: &CheckSpec) -> RunSettings {
    RunSettings {
        steps: c.steps,
        shift: c.shift.unwrap_or(1.0),
        guidance: c.guidance.unwrap_or(5.0),
        guidance_2: c.guidance_2,
        boundary_ratio: c.boundary_ratio,
    }
}

/// Runs the model at `model` on the check's inputs; `config` replaces its config.json (a
/// quantized release carries none: the base's is given).
pub fn run_on(model: &Path, config: Option<&Path>, c: &CheckSpec) -> Result<Tensor, BakeError> {
    let models =
        ModelSet::open(model, config).map_err(|e| BakeError::check_input(&c.name, None, e))?;
    run_set(&models, c)
}

/// Runs opened models (a baked release, or the reference of `bake::reference`) on the
/// check's inputs.
pub fn run_set(models: &ModelSet<'_>, c: &CheckSpec) -> Result<Tensor, BakeError> {
    let fail = |e| BakeError::check_input(&c.name, None, e);
    let inputs = RunInputs::read(&c.inputs).map_err(fail)?;
    let out = run_models(models, &inputs, &c.inputs, &settings(c)).map_err(fail)?;
    Ok(out.tensor)
}

/// Reads the expected tensor of a check with a golden file.
pub fn read_expected(c: &CheckSpec) -> Result<Tensor, BakeError> {
    let path = Path::new(&c.expected);
    let name = expected_tensor_name(c.steps);
    let fail = |reason: String| BakeError::CheckSetup {
        check: c.name.clone().unwrap_or_default(),
        reason,
    };
    let f = crate::io::SafetensorsFile::open(path)
        .map_err(|e| BakeError::check_input(&c.name, None, e))?;
    let i = f
        .position(name)
        .ok_or_else(|| fail(format!("{} has no tensor `{name}`", path.display())))?;
    let view = f.view_at(i);
    let data = view
        .to_f32()
        .map_err(|e| fail(format!("{}: `{name}`: {e}", path.display())))?;
    Ok(Tensor {
        shape: view.shape.to_vec(),
        data,
    })
}

/// Runs check `c` on the baked model at `model` (with `config`, as [`run_on`]) against
/// `expected`; returns the outcome and the tensor the run produced.
pub fn run_check(
    recipe: &Recipe,
    model: &Path,
    config: Option<&Path>,
    c: &CheckSpec,
    expected: &Tensor,
) -> Result<(CheckOutcome, Tensor), BakeError> {
    let started = Instant::now();
    let got = run_on(model, config, c)?;
    let seconds = started.elapsed().as_secs_f64();
    let name = c.name.clone().unwrap_or_default();
    if got.shape != expected.shape {
        return Err(BakeError::CheckSetup {
            check: name,
            reason: format!(
                "the run produced shape {:?}, the expected output has {:?}",
                got.shape, expected.shape
            ),
        });
    }
    let diff = compare(&got.data, &expected.data);
    let outcome = CheckOutcome {
        name,
        inputs: recipe.relative(&c.inputs),
        expected: if c.expected == "unmerged" {
            c.expected.clone()
        } else {
            recipe.relative(Path::new(&c.expected))
        },
        steps: c.steps,
        tensor: expected_tensor_name(c.steps).to_string(),
        max_abs_diff: diff.max_abs,
        mean_abs_diff: diff.mean_abs,
        max_abs_expected: diff.max_expected,
        tolerance: c.tolerance,
        passed: diff.max_abs <= c.tolerance,
        seconds,
        shape: got.shape.clone(),
    };
    Ok((outcome, got))
}

/// Differences between two equally long slices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Diff {
    /// Largest |a − b|; infinity when either side has a NaN or they differ in infinities.
    pub max_abs: f64,
    /// Mean |a − b| (infinity as above).
    pub mean_abs: f64,
    /// Largest |b|.
    pub max_expected: f64,
}

/// Compares `got` with `want` in f64.
pub fn compare(got: &[f32], want: &[f32]) -> Diff {
    let mut max_abs = 0.0f64;
    let mut sum = 0.0f64;
    let mut max_expected = 0.0f64;
    for (&a, &b) in got.iter().zip(want) {
        let d = if a == b {
            0.0
        } else {
            let d = (f64::from(a) - f64::from(b)).abs();
            if d.is_nan() { f64::INFINITY } else { d }
        };
        max_abs = max_abs.max(d);
        sum += d;
        max_expected = max_expected.max(f64::from(b).abs());
    }
    let n = got.len().max(1) as f64;
    Diff {
        max_abs,
        mean_abs: sum / n,
        max_expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_infinities_fail_any_tolerance() {
        assert_eq!(compare(&[1.0, 2.0], &[1.0, 2.5]).max_abs, 0.5);
        assert_eq!(compare(&[f32::NAN], &[1.0]).max_abs, f64::INFINITY);
        assert_eq!(compare(&[f32::NAN], &[f32::NAN]).max_abs, f64::INFINITY);
        assert_eq!(compare(&[f32::INFINITY], &[f32::INFINITY]).max_abs, 0.0);
        assert_eq!(compare(&[f32::INFINITY], &[1.0]).max_abs, f64::INFINITY);
        assert_eq!(
            compare(&[-f32::INFINITY], &[f32::INFINITY]).max_abs,
            f64::INFINITY
        );
    }
}

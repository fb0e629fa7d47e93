//! The VACE context branch of diffusers' `WanVACETransformer3DModel` (diffusers 0.42.1
//! `models/transformers/transformer_wan_vace.py`; golden/variants/vace/FACTS.md §1.6): the
//! control latents go through `vace_patch_embedding` and are zero-padded (after the
//! embedding, so without bias) to the video's token count; VACE block n is
//! `c = proj_in(c) + x` (block 0 only, x the patch-embedded video), then an ordinary WAN block
//! on c with its own `scale_shift_table`, then `hint_n = proj_out(c)`. Every VACE block runs
//! before the main blocks; main block i is followed by `x += hint · scale` with the next hint
//! whenever i is in `vace_layers`.
//!
//! Owns: `Control` (the two control inputs), their shape rules against a config, and `Hints`
//! (the scaled hints and the order they are added in). Does not own: the block arithmetic
//! (`runner::block`, shared with the main blocks) or the main forward (`runner::forward`).

use super::block::{BlockId, BlockInputs, CrossKv, run_block};
use super::embed::{apply_linear, patch_embedding};
use super::error::RunError;
use super::forward::TokenGeometry;
use super::tensor::Tensor;
use super::weights::WeightSource;
use crate::model::wan::WanConfig;

const CONTROL: &str = "control_hidden_states";
const CONTROL_SCALE: &str = "control_hidden_states_scale";

/// The control inputs of a VACE forward, as diffusers' `forward` takes them.
#[derive(Clone, Copy, Debug)]
pub struct Control<'a> {
    /// `control_hidden_states` (B, vace_in_channels, F', H', W'), at most as many tokens as
    /// the video.
    pub hidden_states: &'a Tensor,
    /// `control_hidden_states_scale` (N), one factor per VACE block; absent: ones.
    pub scale: Option<&'a Tensor>,
}

/// Checked control inputs: the latent size of `control_hidden_states`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlGeometry {
    /// Latent (F', H', W').
    pub latent: [usize; 3],
    /// Control tokens per item, ≤ the video's.
    pub tokens: usize,
}

/// Checks the config facts of a VACE model (those diffusers' constructor raises on).
pub fn check_vace_config(cfg: &WanConfig) -> Result<(), String> {
    let Some(layers) = &cfg.vace_layers else {
        return Ok(());
    };
    if !layers.contains(&0) || layers.iter().any(|&l| l >= cfg.num_layers) {
        return Err(format!(
            "vace_layers {layers:?} must include layer 0 and stay below num_layers = {}",
            cfg.num_layers
        ));
    }
    if cfg.vace_in_channels == Some(0) {
        return Err("vace_in_channels must be positive".into());
    }
    Ok(())
}

fn shape_error(tensor: &str, expected: String, found: &[usize]) -> RunError {
    RunError::input(
        tensor,
        format!("expected shape {expected}, found {found:?}"),
    )
}

/// The control inputs against `cfg` and the video geometry `g`: required exactly for a
/// VACE model; returns their geometry.
pub fn check_control(
    cfg: &WanConfig,
    control: Option<&Control<'_>>,
    g: &TokenGeometry,
) -> Result<Option<ControlGeometry>, RunError> {
    match (&cfg.vace_layers, control) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(RunError::input(
            CONTROL,
            "given, but the model is not a VACE model (its config has no vace_layers)",
        )),
        (Some(layers), None) => Err(RunError::input(
            CONTROL,
            format!(
                "missing: this is a VACE model (vace_layers {layers:?}) and needs control latents \
                 of shape ({}, vace_in_channels = {}, F, H, W)",
                g.batch,
                cfg.vace_in_channels.unwrap_or(0)
            ),
        )),
        (Some(layers), Some(c)) => check_control_shapes(cfg, layers, c, g).map(Some),
    }
}

fn check_control_shapes(
    cfg: &WanConfig,
    layers: &[usize],
    c: &Control<'_>,
    g: &TokenGeometry,
) -> Result<ControlGeometry, RunError> {
    let cv = cfg.vace_in_channels.unwrap_or(0);
    let hs = c.hidden_states.shape.as_slice();
    let expected = || format!("({}, vace_in_channels = {cv}, F, H, W)", g.batch);
    let &[b, ch, fl, hl, wl] = hs else {
        return Err(shape_error(CONTROL, expected(), hs));
    };
    if b != g.batch || ch != cv {
        return Err(shape_error(CONTROL, expected(), hs));
    }
    let [pt, ph, pw] = cfg.patch_size;
    for (axis, len, p) in [("F", fl, pt), ("H", hl, ph), ("W", wl, pw)] {
        if len == 0 || len % p != 0 {
            return Err(RunError::input(
                CONTROL,
                format!(
                    "latent {axis} = {len} must be a positive multiple of the patch size {p} (patch_size {:?})",
                    cfg.patch_size
                ),
            ));
        }
    }
    let tokens = (fl / pt) * (hl / ph) * (wl / pw);
    if tokens > g.tokens {
        return Err(RunError::input(
            CONTROL,
            format!(
                "{tokens} control tokens (shape {hs:?}) exceed the video's {} tokens (hidden_states grid {:?}); \
                 a shorter control is padded with zero tokens, a longer one is refused",
                g.tokens, g.grid
            ),
        ));
    }
    if let Some(s) = c.scale
        && s.shape != [layers.len()]
    {
        return Err(shape_error(
            CONTROL_SCALE,
            format!(
                "({}) (one per entry of vace_layers {layers:?})",
                layers.len()
            ),
            &s.shape,
        ));
    }
    Ok(ControlGeometry {
        latent: [fl, hl, wl],
        tokens,
    })
}

/// The hints of every VACE block, already multiplied by their scales, and the main layers
/// they are added after.
#[derive(Clone, Debug)]
pub struct Hints {
    /// (B·S, D) per VACE block, `hint_n · scale_n`.
    scaled: Vec<Vec<f32>>,
    layers: Vec<usize>,
    next: usize,
}

impl Hints {
    /// Runs the VACE blocks on the control tokens; `x` is the patch-embedded video (B·S, D)
    /// before any main block and `kv` the VACE blocks' cross-attention keys and values.
    pub fn new(
        w: &dyn WeightSource,
        x: &[f32],
        control: &Control<'_>,
        cg: &ControlGeometry,
        inp: &BlockInputs<'_>,
        kv: &[CrossKv],
    ) -> Result<Hints, RunError> {
        let cfg = w.config();
        let d = cfg.inner_dim();
        let rows = inp.batch * inp.tokens;
        let cv = cfg.vace_in_channels.unwrap_or(0);
        let emb = patch_embedding(
            w,
            "vace_patch_embedding",
            cv,
            &control.hidden_states.data,
            inp.batch,
            cg.latent,
        )?;
        let mut c = vec![0f32; rows * d];
        for (dst, src) in c.chunks_mut(inp.tokens * d).zip(emb.chunks(cg.tokens * d)) {
            dst[..src.len()].copy_from_slice(src);
        }
        let ones = vec![1f32; kv.len()];
        let scales = control.scale.map_or(ones.as_slice(), |s| s.data.as_slice());
        let mut scaled = Vec::with_capacity(kv.len());
        for (n, (kv_n, &s)) in kv.iter().zip(scales).enumerate() {
            let id = BlockId::Vace(n);
            if n == 0 {
                let pre = format!("{}.proj_in", id.prefix());
                c = apply_linear(w, &pre, &c, rows, d, d)?;
                for (cv, xv) in c.iter_mut().zip(x) {
                    *cv += xv;
                }
            }
            run_block(w, id, &mut c, inp, kv_n)?;
            let pre = format!("{}.proj_out", id.prefix());
            let mut hint = apply_linear(w, &pre, &c, rows, d, d)?;
            for h in &mut hint {
                *h *= s;
            }
            scaled.push(hint);
        }
        Ok(Hints {
            scaled,
            layers: cfg.vace_layers.clone().unwrap_or_default(),
            next: 0,
        })
    }

    /// After main block `layer`: when `layer` is in `vace_layers`, adds the next hint to x
    /// (diffusers pops the hints in VACE-block order at each listed layer, in layer order).
    pub fn add_after(&mut self, layer: usize, x: &mut [f32]) {
        if !self.layers.contains(&layer) {
            return;
        }
        if let Some(hint) = self.scaled.get(self.next) {
            for (xv, h) in x.iter_mut().zip(hint) {
                *xv += h;
            }
        }
        self.next += 1;
    }
}

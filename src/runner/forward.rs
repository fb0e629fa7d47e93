//! The forward pass of diffusers' `WanTransformer3DModel` in f32 (spec wan.md §2): input
//! checks, patch embedding, condition embedding (per item or per token), the blocks, the
//! output head modulated by the pre-projection time embedding, and unpatchify; for a VACE
//! model (`WanVACETransformer3DModel`) the hints of `runner::vace` are added after the
//! listed blocks; for SkyReels-V2 (`SkyReelsV2Transformer3DModel`) the fps condition is added
//! to the timestep projection, and a timestep per latent frame (diffusion forcing) is given
//! to every token of its frame.
//!
//! Owns: `WanTransformer` (a weight source plus its RoPE tables), `ForwardInputs`, and the
//! shape rules an input must satisfy. Does not own: sampling (`runner::sampler`) or files
//! (`runner::inputs`).

use super::block::{BlockId, BlockInputs, CrossKv, cross_kv, modulated_norm, run_block};
use super::embed::{
    apply_linear, fps_projection, image_embedding, patch_embedding, text_embedding, time_embedding,
};
use super::error::RunError;
use super::rope::{Rope, axis_split};
use super::tensor::Tensor;
use super::vace::{Control, Hints, check_control, check_vace_config};
use super::weights::WeightSource;
use crate::model::wan::WanConfig;
use crate::model::wan_names::Scope;

/// Text tokens diffusers assumes when it splits an I2V context into image and text
/// (`image_context_length = encoder_hidden_states.shape[1] - 512`).
pub const TEXT_CONTEXT_LEN: usize = 512;

/// The tensors of one forward call, as diffusers' `forward` takes them.
#[derive(Clone, Copy, Debug)]
pub struct ForwardInputs<'a> {
    /// (B, C_in, F, H, W).
    pub hidden_states: &'a Tensor,
    /// (B) or, per token (Wan2.2 TI2V), (B, S).
    pub timestep: &'a Tensor,
    /// (B, L, text_dim).
    pub encoder_hidden_states: &'a Tensor,
    /// (B, n, image_dim), or (2B, n, image_dim) with 2n = pos_embed_seq_len for FLF2V.
    pub encoder_hidden_states_image: Option<&'a Tensor>,
    /// The control latents (and scales) of a VACE model; required exactly for one.
    pub control: Option<Control<'a>>,
    /// (B) `fps_embedding` indices of a SkyReels-V2 model with `inject_sample_info`;
    /// required exactly for one.
    pub fps: Option<&'a Tensor>,
}

/// Sizes derived from checked inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenGeometry {
    /// Batch size B.
    pub batch: usize,
    /// Latent (F, H, W).
    pub latent: [usize; 3],
    /// Token grid (f, h, w).
    pub grid: [usize; 3],
    /// Tokens per item S = f·h·w.
    pub tokens: usize,
    /// Whether the timestep is per token (or per latent frame, see `frame_timesteps`).
    pub per_token: bool,
    /// Whether the timestep is (B, f), one per token-grid frame (SkyReels-V2 diffusion
    /// forcing); it is given to every token of its frame.
    pub frame_timesteps: bool,
    /// Text tokens per item.
    pub text_len: usize,
    /// Image tokens per item after the FLF2V reshape (0 without image).
    pub image_len: usize,
}

/// The cross-attention context of one transformer for fixed text (and image) embeds: the
/// keys and values of every block. It depends only on those embeds and the weights, so a
/// sampler computes it once per expert and reuses it at every step (bit-identical to
/// recomputing it).
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    /// Name of the weights it was built with.
    pub weights: String,
    /// Shape of the `encoder_hidden_states` it was built from.
    pub text_shape: Vec<usize>,
    /// Shape of the `encoder_hidden_states_image` it was built from.
    pub image_shape: Option<Vec<usize>>,
    /// Per block.
    pub blocks: Vec<CrossKv>,
    /// Per VACE context block (empty for other models).
    pub vace_blocks: Vec<CrossKv>,
}

/// A WAN transformer ready to run: its weights and RoPE tables.
pub struct WanTransformer<'w> {
    weights: &'w dyn WeightSource,
    rope: Rope,
}

impl std::fmt::Debug for WanTransformer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WanTransformer")
            .field("weights", &self.weights.name())
            .finish()
    }
}

/// Checks the config facts the forward relies on.
pub fn check_config(cfg: &WanConfig, name: &str) -> Result<(), RunError> {
    let bad = |reason: String| RunError::Weight {
        source_name: name.to_string(),
        tensor: "config.json".into(),
        reason,
    };
    let dh = cfg.attention_head_dim;
    if cfg.num_attention_heads == 0 || dh == 0 {
        return Err(bad(
            "num_attention_heads and attention_head_dim must be positive".into(),
        ));
    }
    if axis_split(dh).iter().any(|a| a % 2 == 1) {
        return Err(bad(format!(
            "attention_head_dim {dh} splits into RoPE axes {:?}; every axis must be even",
            axis_split(dh)
        )));
    }
    if cfg.patch_size.contains(&0) {
        return Err(bad(format!("patch_size {:?} has a zero", cfg.patch_size)));
    }
    if let Some(p) = cfg.pos_embed_seq_len
        && (cfg.image_dim.is_none() || p % 2 == 1)
    {
        return Err(bad(format!(
            "pos_embed_seq_len {p} needs image_dim and an even length (two images of P/2 tokens)"
        )));
    }
    check_vace_config(cfg).map_err(bad)
}

impl<'w> WanTransformer<'w> {
    /// Prepares a transformer over `weights`.
    pub fn new(weights: &'w dyn WeightSource) -> Result<WanTransformer<'w>, RunError> {
        let cfg = weights.config();
        check_config(cfg, weights.name())?;
        Ok(WanTransformer {
            weights,
            rope: Rope::new(cfg.attention_head_dim, cfg.rope_max_seq_len),
        })
    }

    /// The config.
    pub fn config(&self) -> &WanConfig {
        self.weights.config()
    }

    /// The weights.
    pub fn weights(&self) -> &'w dyn WeightSource {
        self.weights
    }

    /// Checks every input against the config and returns the derived sizes.
    pub fn check(&self, inputs: &ForwardInputs<'_>) -> Result<TokenGeometry, RunError> {
        check_inputs(self.config(), inputs)
    }

    /// The velocity prediction (B, C_out, F, H, W).
    pub fn forward(&self, inputs: &ForwardInputs<'_>) -> Result<Tensor, RunError> {
        self.check(inputs)?;
        let context = self.context(
            inputs.encoder_hidden_states,
            inputs.encoder_hidden_states_image,
        )?;
        self.forward_with(
            inputs.hidden_states,
            inputs.timestep,
            (inputs.control.as_ref(), inputs.fps),
            &context,
        )
    }

    /// The forward for a prepared context (see [`Context`]); `hidden_states`, `timestep`
    /// and the model-specific inputs (a VACE model's control, SkyReels-V2's fps) must have
    /// the context's batch size.
    pub fn forward_with(
        &self,
        hidden_states: &Tensor,
        timestep: &Tensor,
        (control, fps): (Option<&Control<'_>>, Option<&Tensor>),
        context: &Context,
    ) -> Result<Tensor, RunError> {
        let g = check_shapes(
            self.config(),
            &hidden_states.shape,
            &timestep.shape,
            &context.text_shape,
            context.image_shape.as_deref(),
        )?;
        let control_geometry = check_control(self.config(), control, &g)?;
        check_fps(self.config(), fps, g.batch)?;
        let w = self.weights;
        let cfg = w.config();
        let vace_blocks = cfg.blocks_of(Scope::VaceBlock);
        if context.weights != w.name()
            || context.blocks.len() != cfg.num_layers
            || context.vace_blocks.len() != vace_blocks
        {
            return Err(RunError::Options(format!(
                "a cross-attention context built for {} ({} + {} VACE blocks) cannot run on {} ({} + {} VACE blocks)",
                context.weights,
                context.blocks.len(),
                context.vace_blocks.len(),
                w.name(),
                cfg.num_layers,
                vace_blocks
            )));
        }
        let mut x = patch_embedding(
            w,
            "patch_embedding",
            cfg.in_channels,
            &hidden_states.data,
            g.batch,
            g.latent,
        )?;
        let (temb, timestep_proj) = self.time(timestep, fps, &g)?;
        let (rope_cos, rope_sin) = self.rope.token_tables(g.grid);
        let block_inputs = BlockInputs {
            batch: g.batch,
            tokens: g.tokens,
            timestep_proj: &timestep_proj,
            per_token: g.per_token,
            rope_cos: &rope_cos,
            rope_sin: &rope_sin,
        };
        let mut hints = match (control, control_geometry) {
            (Some(c), Some(cg)) => Some(Hints::new(
                w,
                &x,
                c,
                &cg,
                &block_inputs,
                &context.vace_blocks,
            )?),
            _ => None,
        };
        for (i, kv) in context.blocks.iter().enumerate() {
            run_block(w, BlockId::Main(i), &mut x, &block_inputs, kv)?;
            if let Some(h) = &mut hints {
                h.add_after(i, &mut x);
            }
        }
        self.head(x, &temb, &block_inputs, &g)
    }

    /// Embeds the text (and image) context and computes every block's cross-attention keys
    /// and values. diffusers concatenates [image, text] and, for a model with add_k_proj,
    /// splits it again at length − 512 (image part first).
    pub fn context(
        &self,
        encoder_hidden_states: &Tensor,
        image: Option<&Tensor>,
    ) -> Result<Context, RunError> {
        let w = self.weights;
        let cfg = w.config();
        let d = cfg.inner_dim();
        let (batch, text_len, image_len) = check_context(
            cfg,
            &encoder_hidden_states.shape,
            image.map(|t| t.shape.as_slice()),
        )?;
        let text = text_embedding(w, &encoder_hidden_states.data, batch * text_len)?;
        let image_emb = match image {
            Some(img) => image_embedding(w, &img.data, batch * image_len, image_len)?,
            None => Vec::new(),
        };
        let full = concat_per_item(&image_emb, image_len, &text, text_len, batch, d);
        let total = image_len + text_len;
        let split = if cfg.added_kv_proj_dim.is_some() {
            total - TEXT_CONTEXT_LEN
        } else {
            0
        };
        let mut img_part = Vec::with_capacity(batch * split * d);
        let mut txt_part = Vec::with_capacity(batch * (total - split) * d);
        for item in full.chunks(total * d) {
            img_part.extend_from_slice(&item[..split * d]);
            txt_part.extend_from_slice(&item[split * d..]);
        }
        let image_branch = cfg.added_kv_proj_dim.map(|_| (img_part.as_slice(), split));
        let text = (txt_part.as_slice(), total - split);
        let kv = |id| cross_kv(w, id, batch, text, image_branch);
        let blocks = (0..cfg.num_layers)
            .map(|i| kv(BlockId::Main(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let vace_blocks = (0..cfg.blocks_of(Scope::VaceBlock))
            .map(|n| kv(BlockId::Vace(n)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Context {
            weights: w.name().to_string(),
            text_shape: encoder_hidden_states.shape.clone(),
            image_shape: image.map(|t| t.shape.clone()),
            blocks,
            vace_blocks,
        })
    }

    /// `temb` and `timestep_proj` per item or per token (a timestep per frame given to each
    /// token of the frame), plus SkyReels-V2's fps projection on every row of its item.
    fn time(
        &self,
        timestep: &Tensor,
        fps: Option<&Tensor>,
        g: &TokenGeometry,
    ) -> Result<(Vec<f32>, Vec<f32>), RunError> {
        let w = self.weights;
        let d = w.config().inner_dim();
        let per_frame = g.tokens / g.grid[0];
        let steps: Vec<f32> = if g.frame_timesteps {
            let repeat = |&t: &f32| std::iter::repeat_n(t, per_frame);
            timestep.data.iter().flat_map(repeat).collect()
        } else {
            timestep.data.clone()
        };
        let (temb, mut proj) = time_embedding(w, &steps)?;
        if let Some(fps) = fps {
            let add = fps_projection(w, &fps.data)?;
            let rows = if g.per_token { g.tokens } else { 1 };
            for (item, f) in proj.chunks_mut(rows * 6 * d).zip(add.chunks(6 * d)) {
                for row in item.chunks_mut(6 * d) {
                    for (p, a) in row.iter_mut().zip(f) {
                        *p += a;
                    }
                }
            }
        }
        Ok((temb, proj))
    }

    /// norm_out modulated by (table + temb), proj_out, unpatchify.
    fn head(
        &self,
        mut x: Vec<f32>,
        temb: &[f32],
        inp: &BlockInputs<'_>,
        g: &TokenGeometry,
    ) -> Result<Tensor, RunError> {
        let w = self.weights;
        let cfg = w.config();
        let d = cfg.inner_dim();
        let table = w.tensor("scale_shift_table")?;
        modulated_norm(&mut x, d, cfg.eps as f32, |r| {
            let t = &temb[inp.time_row(r) * d..][..d];
            ((&table[..d], t), (&table[d..2 * d], t))
        });
        let c_out = cfg.out_channels();
        let per_token = c_out * cfg.patch_volume();
        let proj = apply_linear(w, "proj_out", &x, g.batch * g.tokens, d, per_token)?;
        Ok(unpatchify(&proj, g, cfg.patch_size, c_out))
    }
}

/// Per item, `[a_item, b_item]` along the token axis; a is (B, la, d), b is (B, lb, d).
fn concat_per_item(a: &[f32], la: usize, b: &[f32], lb: usize, batch: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * (la + lb) * d);
    for i in 0..batch {
        out.extend_from_slice(&a[i * la * d..(i + 1) * la * d]);
        out.extend_from_slice(&b[i * lb * d..(i + 1) * lb * d]);
    }
    out
}

/// out[b, c, fi·pt + a, hi·ph + β, wi·pw + γ] = proj[b, n, ((a·ph + β)·pw + γ)·C_out + c],
/// with n = (fi·h + hi)·w + wi (spec wan.md §2.5).
pub fn unpatchify(proj: &[f32], g: &TokenGeometry, patch: [usize; 3], c_out: usize) -> Tensor {
    let [pt, ph, pw] = patch;
    let [f, h, w] = g.grid;
    let [fl, hl, wl] = g.latent;
    let per_token = c_out * pt * ph * pw;
    let mut out = vec![0f32; g.batch * c_out * fl * hl * wl];
    for b in 0..g.batch {
        for n in 0..f * h * w {
            let (fi, hi, wi) = (n / (h * w), (n / w) % h, n % w);
            let src = &proj[(b * g.tokens + n) * per_token..][..per_token];
            for a in 0..pt {
                for be in 0..ph {
                    for ga in 0..pw {
                        for c in 0..c_out {
                            let v = src[((a * ph + be) * pw + ga) * c_out + c];
                            let at = (((b * c_out + c) * fl + fi * pt + a) * hl + hi * ph + be)
                                * wl
                                + wi * pw
                                + ga;
                            out[at] = v;
                        }
                    }
                }
            }
        }
    }
    Tensor::new(vec![g.batch, c_out, fl, hl, wl], out)
}

fn shape_error(tensor: &str, expected: String, found: &[usize]) -> RunError {
    RunError::input(
        tensor,
        format!("expected shape {expected}, found {found:?}"),
    )
}

/// The shape rules of spec wan.md §2.0 against `cfg`, and a VACE model's control inputs.
pub fn check_inputs(
    cfg: &WanConfig,
    inputs: &ForwardInputs<'_>,
) -> Result<TokenGeometry, RunError> {
    let g = check_shapes(
        cfg,
        &inputs.hidden_states.shape,
        &inputs.timestep.shape,
        &inputs.encoder_hidden_states.shape,
        inputs
            .encoder_hidden_states_image
            .map(|t| t.shape.as_slice()),
    )?;
    check_control(cfg, inputs.control.as_ref(), &g)?;
    check_fps(cfg, inputs.fps, g.batch)?;
    Ok(g)
}

/// SkyReels-V2's `fps`: required exactly when the model has `inject_sample_info`, one
/// index into its two-row `fps_embedding` per item.
fn check_fps(cfg: &WanConfig, fps: Option<&Tensor>, batch: usize) -> Result<(), RunError> {
    match (cfg.inject_sample_info, fps) {
        (false, None) => Ok(()),
        (false, Some(_)) => Err(RunError::input(
            "fps",
            "given, but the model has no fps embedding (inject_sample_info is false)",
        )),
        (true, None) => Err(RunError::input(
            "fps",
            format!(
                "missing: this SkyReels-V2 model (inject_sample_info) needs ({batch}) fps_embedding \
                 indices (diffusers' pipeline passes 0 for 16 fps, else 1)"
            ),
        )),
        (true, Some(f)) if f.shape != [batch] => {
            Err(shape_error("fps", format!("({batch})"), &f.shape))
        }
        (true, Some(f)) => match f.data.iter().find(|&&v| v != 0.0 && v != 1.0) {
            Some(v) => Err(RunError::input(
                "fps",
                format!("expected fps_embedding indices 0 or 1, found {v}"),
            )),
            None => Ok(()),
        },
    }
}

/// [`check_inputs`] on shapes: hidden_states, timestep, encoder_hidden_states and the
/// optional image embeds.
pub fn check_shapes(
    cfg: &WanConfig,
    hs: &[usize],
    ts: &[usize],
    ehs: &[usize],
    image: Option<&[usize]>,
) -> Result<TokenGeometry, RunError> {
    let [pt, ph, pw] = cfg.patch_size;
    let c_in = cfg.in_channels;
    let &[batch, c, fl, hl, wl] = hs else {
        return Err(shape_error(
            "hidden_states",
            format!("(B, {c_in}, F, H, W)"),
            hs,
        ));
    };
    if c != c_in || batch == 0 {
        return Err(shape_error(
            "hidden_states",
            format!("(B ≥ 1, in_channels = {c_in}, F, H, W)"),
            hs,
        ));
    }
    for (axis, len, p) in [("F", fl, pt), ("H", hl, ph), ("W", wl, pw)] {
        if len == 0 || len % p != 0 {
            return Err(RunError::input(
                "hidden_states",
                format!(
                    "latent {axis} = {len} must be a positive multiple of the patch size {p} (patch_size {:?})",
                    cfg.patch_size
                ),
            ));
        }
    }
    let grid = [fl / pt, hl / ph, wl / pw];
    if let Some(g) = grid.iter().find(|&&g| g > cfg.rope_max_seq_len) {
        return Err(RunError::input(
            "hidden_states",
            format!(
                "{g} patches along one axis exceed rope_max_seq_len = {} (grid {grid:?})",
                cfg.rope_max_seq_len
            ),
        ));
    }
    let tokens = grid.iter().product();
    let (per_token, frame_timesteps) = match ts {
        [b] if *b == batch => (false, false),
        [b, s] if *b == batch && *s == tokens => (true, false),
        [b, f] if *b == batch && *f == grid[0] => (true, true),
        _ => {
            return Err(shape_error(
                "timestep",
                format!(
                    "({batch}), ({batch}, {tokens}) per token or ({batch}, {}) per frame for a {grid:?} token grid",
                    grid[0]
                ),
                ts,
            ));
        }
    };
    let (text_batch, text_len, image_len) = check_context(cfg, ehs, image)?;
    if text_batch != batch {
        return Err(shape_error(
            "encoder_hidden_states",
            format!(
                "({batch}, L, text_dim = {}) (the batch of hidden_states)",
                cfg.text_dim
            ),
            ehs,
        ));
    }
    Ok(TokenGeometry {
        batch,
        latent: [fl, hl, wl],
        grid,
        tokens,
        per_token,
        frame_timesteps,
        text_len,
        image_len,
    })
}

/// The context's shape rules; returns (B, text tokens, image tokens per item).
fn check_context(
    cfg: &WanConfig,
    ehs: &[usize],
    image: Option<&[usize]>,
) -> Result<(usize, usize, usize), RunError> {
    let (batch, text_len) = match ehs {
        [b, l, t] if *t == cfg.text_dim && *l > 0 && *b > 0 => (*b, *l),
        _ => {
            return Err(shape_error(
                "encoder_hidden_states",
                format!("(B, L, text_dim = {})", cfg.text_dim),
                ehs,
            ));
        }
    };
    let image_len = check_image(cfg, image, batch)?;
    if cfg.added_kv_proj_dim.is_some() && image_len + text_len <= TEXT_CONTEXT_LEN {
        return Err(RunError::input(
            "encoder_hidden_states",
            format!(
                "an I2V model splits the context at length − {TEXT_CONTEXT_LEN} (diffusers' hard-coded text length); \
                 {image_len} image + {text_len} text tokens leave no image tokens (pad the text to 512 tokens)"
            ),
        ));
    }
    Ok((batch, text_len, image_len))
}

/// Image embeds against the config; returns image tokens per item (0 when absent).
fn check_image(cfg: &WanConfig, image: Option<&[usize]>, batch: usize) -> Result<usize, RunError> {
    const NAME: &str = "encoder_hidden_states_image";
    let Some(image) = image else {
        if cfg.added_kv_proj_dim.is_some() {
            return Err(RunError::input(
                NAME,
                "missing: this is an I2V/FLF2V model (added_kv_proj_dim is set) and needs CLIP image embeds",
            ));
        }
        return Ok(0);
    };
    let Some(i) = cfg.image_dim else {
        return Err(RunError::input(
            NAME,
            "given, but the model has no image embedder (image_dim is null in config.json)",
        ));
    };
    match (image, cfg.pos_embed_seq_len) {
        ([b, n, c], None) if *b == batch && *c == i && *n > 0 => Ok(*n),
        ([b, n, c], Some(p)) if *b == 2 * batch && *c == i && 2 * n == p => Ok(p),
        (found, None) => Err(shape_error(
            NAME,
            format!("({batch}, n, image_dim = {i})"),
            found,
        )),
        (found, Some(p)) => Err(shape_error(
            NAME,
            format!(
                "({}, {}, image_dim = {i}) (FLF2V: first and last frame per item)",
                2 * batch,
                p / 2
            ),
            found,
        )),
    }
}
